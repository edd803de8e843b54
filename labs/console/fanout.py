"""The holder's output pipeline behind its own browser: one task appends queued output to the scrollback and
publishes it to the console group in order, batched; the bounded queue makes the upstream wait (TCP pushes back).
With nobody else watching nothing is published."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from labs.console.state import LocalConsoleState, RedisConsoleState
from portal.waiting import cancel_and_wait, wait_event

logger = logging.getLogger(__name__)

BATCH_BYTES = 256 * 1024
MAX_PENDING_BYTES = 2 * 1024 * 1024
# Alone, the holder lets small output (keystroke echoes) gather this long before appending it to the scrollback;
# whoever needs the scrollback current (a newcomer's sync, a redraw) flushes first, which ends the wait.
ALONE_LINGER_SECONDS = 1.0


class OutputFanout:
    def __init__(
        self,
        *,
        attempt_id: int,
        state: LocalConsoleState | RedisConsoleState,
        channel_layer,
        group: str,
        origin: str,
        start_end: int,
        others: bool = True,
    ) -> None:
        self.attempt_id = attempt_id
        self.state = state
        # Whether anybody else watches, and as of when (time.monotonic()).
        self.others = others
        self.others_as_of = time.monotonic()
        self.channel_layer = channel_layer
        self.group = group
        self.origin = origin
        # Offsets this holder hands out for its own browser; the scrollback's (authoritative) ones are published.
        self.end = start_end
        self.published_end = start_end
        self.pending: deque[bytes] = deque()
        self.pending_bytes = 0
        self.wakeup = asyncio.Event()
        self.room = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        # Chunks put, and chunks published (or given up on): flush() waits for the second to reach the first.
        self.put_count = 0
        self.done_count = 0
        self.progress = asyncio.Event()
        self.urgent = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"console-{attempt_id}-fanout")

    def claim(self, size: int) -> int:
        self.end += size
        return self.end

    async def put(self, data: bytes) -> None:
        while self.pending_bytes > MAX_PENDING_BYTES:
            self.room.clear()
            await self.room.wait()
        self.pending.append(data)
        self.pending_bytes += len(data)
        self.put_count += 1
        self.idle.clear()
        if self.pending_bytes >= BATCH_BYTES:
            self.urgent.set()  # a flood, not typing: no reason to wait for more
        self.wakeup.set()

    def _take_batch(self) -> tuple[bytes, int]:
        parts: list[bytes] = []
        size = 0
        while self.pending and (not parts or size + len(self.pending[0]) <= BATCH_BYTES):
            part = self.pending.popleft()
            parts.append(part)
            size += len(part)
        self.pending_bytes -= size
        self.room.set()
        return b"".join(parts), len(parts)

    def viewer_joined(self) -> None:
        """Another viewer announced itself: publish from now on."""
        self.others = True
        self.others_as_of = time.monotonic()
        self.urgent.set()

    def observe_others(self, others: bool, as_of: float) -> None:
        """The beat's finding, from a look that started at ``as_of``. A look older than the last newcomer's
        announcement may have missed its registration, so it does not count."""
        if as_of > self.others_as_of:
            self.others = others
            self.others_as_of = as_of

    async def _publish(self, data: bytes) -> None:
        end = await self.state.scrollback_append(attempt_id=self.attempt_id, data=data)
        if end != self.published_end + len(data):
            # Someone else appended too (a holder that lost its lease unawares): viewers resynchronise on the gap.
            logger.warning(
                "Console %s: scrollback offset %s, expected %s", self.attempt_id, end, self.published_end + len(data)
            )
        self.published_end = end
        if not self.others:
            return
        await self.channel_layer.group_send(
            self.group, {"type": "console.output", "data": data, "end": end, "origin": self.origin}
        )

    async def _run(self) -> None:
        while True:
            if not self.pending:
                self.idle.set()
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            if not self.others and self.pending_bytes < BATCH_BYTES and not self.urgent.is_set():
                await wait_event(self.urgent, ALONE_LINGER_SECONDS)
            data, chunks = self._take_batch()
            if not self.pending:
                self.urgent.clear()
            try:
                await self._publish(data)
            except Exception:
                logger.exception("Console %s: output could not be shared with other viewers", self.attempt_id)
            self.done_count += chunks
            self.progress.set()

    async def flush(self) -> None:
        """Return once everything put so far is in the scrollback (and published), not waiting for later output."""
        target = self.put_count
        if self.done_count < target:
            self.urgent.set()
        # A closed fan-out publishes nothing more: nobody would wake the wait.
        while self.done_count < target and not self.task.done():
            self.progress.clear()
            await self.progress.wait()

    async def close(self, *, within: float = 2.0) -> None:
        """Publish what is queued (briefly), then stop."""
        self.urgent.set()
        await wait_event(self.idle, within)
        await cancel_and_wait(self.task)
        self.progress.set()  # a flush() waiting for output that will never be published returns
