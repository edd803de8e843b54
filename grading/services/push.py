"""Browser updates: ``grading.update`` messages sent to the attempt's channel-layer group after commit.

Sending through ``async_to_sync`` makes a new event loop, and with it a new Redis connection, for every message
(about 20 ms each, twice per run, on the grading path). Instead each process keeps one sender thread with a
persistent loop; messages are queued to it in order and sent one after another, so a run's ``running`` update
never overtakes its ``done``. The caller never waits for Redis: the run is stored whatever happens to the push,
and a page that reconnects reads the current state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from grading.models import CheckResult, GradingRun

logger = logging.getLogger(__name__)


class _Sender:
    """One daemon thread per process running an event loop that sends queued messages in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[Any, str, dict[str, Any]]] | None = None
        self._pid: int | None = None

    def submit(self, layer: Any, group: str, message: dict[str, Any]) -> None:
        loop, queue = self._started()
        loop.call_soon_threadsafe(queue.put_nowait, (layer, group, message))

    def _started(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
        with self._lock:
            # A forked worker child inherits the object but not the thread: start a fresh one there.
            if self._loop is None or self._pid != os.getpid():
                ready = threading.Event()
                self._pid = os.getpid()
                thread = threading.Thread(target=self._run, args=(ready,), name="grading-push", daemon=True)
                thread.start()
                ready.wait()
            assert self._loop is not None and self._queue is not None
            return self._loop, self._queue

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._queue = asyncio.Queue()
        ready.set()
        loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            layer, group, message = await self._queue.get()
            try:
                await layer.group_send(group, message)
            except Exception:
                logger.warning("could not push %s to %s", message.get("type"), group, exc_info=True)


_sender = _Sender()


def send_to_attempt_group(*, attempt_id: int, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    group = f"attempt-{attempt_id}"
    if isinstance(layer, InMemoryChannelLayer):
        # The in-memory layer's queues belong to the web server's loop; keep the plain path there.
        async_to_sync(layer.group_send)(group, message)
        return
    _sender.submit(layer, group, message)


def push_run_on_commit(*, run: GradingRun, results: Sequence[CheckResult] | None = None) -> None:
    """After commit, send ``{"type": "grading.update", "run": <payload>}`` to ``attempt-<id>``.

    ``results`` are the run's results when the caller holds them (none for a queued, running or failed run);
    otherwise they are read at commit time.
    """
    run_id, attempt_id = run.pk, run.attempt_id

    def push() -> None:
        from grading.selectors import grading_run_payload

        try:
            if results is None:
                fresh = GradingRun.objects.filter(pk=run_id).prefetch_related("results").first()
                if fresh is None:
                    return
                payload = grading_run_payload(fresh)
            else:
                payload = grading_run_payload(run, results=results)
            send_to_attempt_group(attempt_id=attempt_id, message={"type": "grading.update", "run": payload})
        except Exception:
            # The run is stored whatever happens here; the page shows it on its next load.
            logger.warning("grading run %s: could not push the update to attempt-%s", run_id, attempt_id,
                           exc_info=True)

    transaction.on_commit(push)
