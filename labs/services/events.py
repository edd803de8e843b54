"""Telling browsers that an attempt changed: ``attempt.update`` on the channel-layer group ``attempt-<id>``,
sent after the transaction that made the change commits (never for a change that was rolled back).

Sending through ``async_to_sync`` from a thread with no event loop (a Celery worker) makes a new event loop, and
with it a new Redis connection, for every message: a connect, a send and a close, and under a burst of starts the
worker's largest single cost. Instead each process keeps one sender thread with a persistent loop (and so a pooled
connection); messages are queued to it and sent one after another in order, so an attempt's ``provisioning``
never overtakes its ``starting``, nor a grading run's ``running`` its ``done``. The caller never waits for Redis:
the state is stored whatever happens to the push, and a page that reconnects reads the current state.

An update may be *held* (``hold``): sent that many seconds later unless a newer message of the same type for the
same group comes from this process first, which then replaces it (an ``attempt.update`` carries the whole attempt,
so the newer one says everything the held one did). The worker holds ``provisioning``, which is news only when
creating the VM takes a while: usually ``starting`` follows within a fraction of a second and the page gets one
update instead of two. Pages ignore an update whose state is behind the one they show (``static/js/attempt.js``),
so a held update released after another process's newer one (a stop) changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from labs.models import Attempt

logger = logging.getLogger(__name__)


class _Sender:
    """One daemon thread per process running an event loop that sends queued messages in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: tuple[int, asyncio.AbstractEventLoop, asyncio.Queue] | None = None
        # (group, message type) -> the timer that will queue a held message; touched only on the sender's loop.
        self._held: dict[tuple[str, str], asyncio.TimerHandle] = {}

    def submit(self, layer: Any, group: str, message: dict[str, Any], *, hold: float = 0.0) -> None:
        loop, queue = self._running()
        loop.call_soon_threadsafe(self._accept, loop, queue, (layer, group, message), hold)

    def _accept(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: tuple, hold: float) -> None:
        """On the sender's loop, in submission order: a held message of the same kind is replaced by this one."""
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

    def _running(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
        with self._lock:
            # A forked worker child inherits the object but not the thread: start a fresh one there.
            if self._started is None or self._started[0] != os.getpid():
                loop = asyncio.new_event_loop()
                queue: asyncio.Queue = asyncio.Queue()  # bound to the loop that first awaits it: the sender's
                threading.Thread(
                    target=loop.run_until_complete, args=(self._drain(queue),), name="channel-push", daemon=True
                ).start()
                self._started = (os.getpid(), loop, queue)
            return self._started[1], self._started[2]

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
    """Send ``message`` to a channel-layer group without waiting for it (in order with this process's others);
    with ``hold``, ``hold`` seconds later unless a newer message of its type for the group replaces it."""
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        # The in-memory layer's queues belong to the web server's loop; keep the plain path there (and send at
        # once: the embedded default has one process and no burst to spare).
        async_to_sync(layer.group_send)(group, message)
        return
    _sender.submit(layer, group, message, hold=hold)


def attempt_group(attempt_id: int) -> str:
    return f"attempt-{attempt_id}"


def lab_class_group(lab_id: int) -> str:
    """The staff's class views of a lab (``grading.class_view_consumer``)."""
    return f"class-{int(lab_id)}"


# Announcements to a lab's class views are coalesced: a class starting together sends a few, not hundreds.
CLASS_CHANGED_HOLD_SECONDS = 0.5


def class_changed_on_commit(*, lab_id: int) -> None:
    """After commit, tell the lab's class views that one of its attempts changed (they render the table anew)."""

    def push() -> None:
        try:
            send_to_group(lab_class_group(lab_id), {"type": "class.changed"}, hold=CLASS_CHANGED_HOLD_SECONDS)
        except Exception:
            logger.warning("could not tell the class view of lab %s", lab_id, exc_info=True)

    transaction.on_commit(push)


def attempt_push_on_commit(*, attempt: Attempt, hold: float = 0.0) -> None:
    """Queue an ``attempt.update`` with the attempt's payload as it stands now, to be sent on commit (at once when
    no transaction is open: the write before it has committed by itself). ``hold``: see ``send_to_group``."""
    from labs.selectors import attempt_status_payload

    message = {"type": "attempt.update", "attempt": attempt_status_payload(attempt)}
    # The payload's words are in the active language; the sockets of readers in other languages take theirs here.
    wording = {
        key: texts
        for key, texts in (("failure_reason", attempt.failure_reason_texts), ("message", attempt.status_message_texts))
        if texts
    }
    if wording:
        message["wording"] = wording
    group = attempt_group(attempt.id)

    def push() -> None:
        try:
            send_to_group(group, message, hold=hold)
        except Exception:
            # The page also polls its status; a lost push delays the browser, it loses no state.
            logger.warning("could not push attempt.update to %s", group, exc_info=True)

    transaction.on_commit(push)
    if "lab_id" not in attempt.get_deferred_fields():  # reading a deferred lab_id would cost a query
        class_changed_on_commit(lab_id=attempt.lab_id)


def on_commit_logged(action: Callable[[], object], *, what: str) -> None:
    """Run ``action`` after commit; if it fails (the broker is down), log it instead of failing the request that
    already committed. The sweep re-enqueues work an attempt is still waiting for."""

    def run() -> None:
        try:
            action()
        except Exception:
            logger.exception("after commit: %s failed; the sweep will retry it", what)

    transaction.on_commit(run)
