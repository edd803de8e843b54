"""Telling browsers that an attempt changed, after commit, through one sender thread per process (it keeps the
messages' order); a *held* message goes later unless a newer one of its type for the group replaces it."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from labs.models import ACTIVE_STATES, Attempt
from labs.wording import cluster_notice, in_every_language

logger = logging.getLogger(__name__)


class _Sender:
    """One daemon thread per process running an event loop that sends queued messages in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: tuple[int, asyncio.AbstractEventLoop, asyncio.Queue] | None = None
        # (group, message type) -> the timer that will queue a held message; touched only on the sender's loop.
        self._held: dict[tuple[str, str], asyncio.TimerHandle] = {}

    def submit(self, layer: Any, group: str, message: dict[str, Any], *, hold: float = 0.0) -> None:
        with self._lock:
            # A forked worker child inherits the object but not the thread: start a fresh one there.
            if self._started is None or self._started[0] != os.getpid():
                loop = asyncio.new_event_loop()
                queue: asyncio.Queue = asyncio.Queue()  # bound to the loop that first awaits it: the sender's
                threading.Thread(
                    target=loop.run_until_complete, args=(self._drain(queue),), name="channel-push", daemon=True
                ).start()
                self._started = (os.getpid(), loop, queue)
            _pid, loop, queue = self._started
        loop.call_soon_threadsafe(self._accept, loop, queue, (layer, group, message), hold)

    def _accept(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: tuple, hold: float) -> None:
        """On the sender's loop, in order: this message replaces a held one of its kind."""
        _layer, group, message = item
        key = (group, message.get("type", ""))
        superseded = self._held.pop(key, None)
        if superseded is not None:
            superseded.cancel()
        if hold > 0:
            self._held[key] = loop.call_later(hold, self._release, queue, key, item)
        else:
            queue.put_nowait(item)

    def _release(self, queue: asyncio.Queue, key: tuple[str, str], item: tuple) -> None:
        self._held.pop(key, None)
        queue.put_nowait(item)

    @staticmethod
    async def _drain(queue: asyncio.Queue) -> None:
        while True:
            layer, group, message = await queue.get()
            try:
                await layer.group_send(group, message)
            except Exception:
                # The page also polls its status; a lost push delays the browser, it loses no state.
                logger.warning("could not push %s to %s", message.get("type"), group, exc_info=True)


_sender = _Sender()


def send_to_group(group: str, message: dict[str, Any], *, hold: float = 0.0) -> None:
    """Send ``message`` to a group without waiting (in order with this process's others); ``hold``: see above."""
    try:
        layer = get_channel_layer()
        if isinstance(layer, InMemoryChannelLayer):
            # The in-memory layer's queues belong to the web server's loop: send there at once.
            async_to_sync(layer.group_send)(group, message)
        elif layer is not None:
            _sender.submit(layer, group, message, hold=hold)
    except Exception:
        # The page also polls its status; a lost push delays the browser, it loses no state.
        logger.warning("could not push %s to %s", message.get("type"), group, exc_info=True)


def attempt_group(attempt_id: int) -> str:
    return f"attempt-{attempt_id}"


def lab_class_group(lab_id: int) -> str:
    """The staff's class views of a lab (``grading.class_view_consumer``)."""
    return f"class-{int(lab_id)}"


# Announcements to a lab's class views are coalesced: a class starting together sends a few, not hundreds.
CLASS_CHANGED_HOLD_SECONDS = 0.5


def attempt_push_on_commit(*, attempt: Attempt, hold: float = 0.0) -> None:
    """Queue an ``attempt.update`` with the attempt's payload as it stands now, to be sent on commit."""
    from labs.selectors import attempt_status_payload

    message = {"type": "attempt.update", "attempt": attempt_status_payload(attempt)}
    # The payload's words are in the active language; the sockets of readers in other languages take theirs here.
    wording = {"failure_reason": attempt.failure_reason_texts, "message": attempt.status_message_texts}
    if any(wording.values()):
        message["wording"] = {key: texts for key, texts in wording.items() if texts}
    transaction.on_commit(lambda: send_to_group(attempt_group(attempt.id), message, hold=hold))
    # The lab's class views render their table anew; reading a deferred lab_id would cost a query.
    if "lab_id" not in attempt.get_deferred_fields():
        changed = {"type": "class.changed"}
        group = lab_class_group(attempt.lab_id)
        transaction.on_commit(lambda: send_to_group(group, changed, hold=CLASS_CHANGED_HOLD_SECONDS))


def cluster_notice_push(*, troubles: Mapping[str, str]) -> None:
    """Tell the page of every active attempt in the namespaces of ``troubles`` what ``cluster_notice`` now says for
    it during its namespace's trouble, in every language ("" when all is well)."""
    texts: dict[tuple[str, str], dict[str, str]] = {}
    attempts = Attempt.objects.filter(state__in=ACTIVE_STATES, namespace__in=list(troubles))
    for attempt_id, state, namespace in attempts.values_list("id", "state", "namespace"):
        key = (state, troubles[namespace])
        if key not in texts:
            texts[key] = in_every_language(partial(_notice, *key))
        send_to_group(attempt_group(attempt_id), {"type": "cluster.notice", "texts": texts[key]})


def _notice(state: str, trouble: str) -> str:
    return cluster_notice(state=state, trouble=trouble) or ""


def on_commit_logged(action: Callable[[], object], *, what: str) -> None:
    """Run ``action`` after commit; a failure (the broker down) is logged, and the sweep queues the work again."""

    def run() -> None:
        try:
            action()
        except Exception:
            logger.exception("after commit: %s failed; the sweep will retry it", what)

    transaction.on_commit(run)
