"""Recent console output per attempt, replayed to a tab that (re)connects; each chunk's running offset lets a viewer
skip what it has, so a snapshot taken while output flows is neither doubled nor torn. In Redis, or in-process."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from labs.console.redis_client import console_key, shared_redis

# Keys expire a day after the last output: long enough for a student to come back, short enough to clean up.
SCROLLBACK_EXPIRY_SECONDS = 24 * 3600

# Append, count, and trim each buffer once it holds twice its limit, so trimming costs O(1) amortised. One call
# appends to several attempts' buffers: KEYS are (buffer, offset) pairs, ARGV each pair's data and limit, then the
# expiry. Returns each pair's new end offset.
_APPEND = """
local count = #KEYS / 2
local expiry = ARGV[2 * count + 1]
local ends = {}
for i = 1, count do
  local buffer, offset, data, limit = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local length = redis.call('APPEND', buffer, data)
  ends[i] = redis.call('INCRBY', offset, string.len(data))
  if length > 2 * limit then
    redis.call('SET', buffer, redis.call('GETRANGE', buffer, length - limit, -1))
  end
  redis.call('EXPIRE', buffer, expiry)
  redis.call('EXPIRE', offset, expiry)
end
return ends
"""
_SNAPSHOT = """
return {redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '0'}
"""


@dataclass(frozen=True)
class ScrollbackSnapshot:
    data: bytes
    end: int


def tail_for_replay(data: bytes, limit: int) -> bytes:
    """The last ``limit`` bytes, starting at a line boundary when one is near so replay starts cleanly."""
    if len(data) <= limit:
        return data
    tail = data[-limit:]
    newline = tail.find(b"\n", 0, 1024)
    return tail[newline + 1 :] if newline >= 0 else tail


class Scrollback(Protocol):
    async def append(self, *, attempt_id: int, data: bytes) -> int: ...
    async def snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot: ...


def _keys(attempt_id: int) -> tuple[str, str]:
    return console_key("scrollback", attempt_id), console_key("offset", attempt_id)


class ScrollbackAppends:
    """Appends asked for in the same turn of the event loop, sent to Redis as one call.

    Consoles alone with their holder append on a shared beat (see fanout), so a process serving two hundred of
    them pays one round trip per beat instead of two hundred.
    """

    def __init__(self, client) -> None:
        self.script = client.register_script(_APPEND)
        self.queued: list[tuple[int, bytes, int, asyncio.Future]] = []
        self.sending: set[asyncio.Task] = set()

    async def append(self, *, attempt_id: int, data: bytes, limit: int) -> int:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.queued:
            loop.call_soon(self._send)  # after every append asked for in this turn
        self.queued.append((attempt_id, data, limit, future))
        return await future

    def _send(self) -> None:
        batch, self.queued = self.queued, []
        task = asyncio.get_running_loop().create_task(self._run(batch), name="console-scrollback-append")
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)

    async def _run(self, batch: list[tuple[int, bytes, int, asyncio.Future]]) -> None:
        keys = [key for attempt_id, *_ in batch for key in _keys(attempt_id)]
        args = [value for _, data, limit, _ in batch for value in (data, limit)] + [SCROLLBACK_EXPIRY_SECONDS]
        try:
            ends = await self.script(keys=keys, args=args)
        except Exception as exc:  # each caller sees what went wrong, as if it had asked alone
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), end in zip(batch, ends, strict=True):
            if not future.done():
                future.set_result(int(end))


_appends: weakref.WeakKeyDictionary[Any, ScrollbackAppends] = weakref.WeakKeyDictionary()


class RedisScrollback:
    def __init__(self, client, *, limit: int) -> None:
        self.client = client
        self.limit = limit
        appends = _appends.get(client)
        if appends is None:
            appends = _appends[client] = ScrollbackAppends(client)
        self.appends = appends

    async def append(self, *, attempt_id: int, data: bytes) -> int:
        return await self.appends.append(attempt_id=attempt_id, data=data, limit=self.limit)

    async def snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot:
        data, end = await self.client.eval(_SNAPSHOT, 2, *_keys(attempt_id))
        return ScrollbackSnapshot(data=tail_for_replay(bytes(data), self.limit), end=int(end))


class LocalScrollback:
    """Process-local buffers for the single-process embedded mode."""

    _buffers: dict[int, tuple[bytearray, int]] = {}

    def __init__(self, *, limit: int) -> None:
        self.limit = limit

    async def append(self, *, attempt_id: int, data: bytes) -> int:
        buffer, end = self._buffers.get(attempt_id, (bytearray(), 0))
        buffer += data
        if len(buffer) > 2 * self.limit:
            del buffer[: len(buffer) - self.limit]
        end += len(data)
        self._buffers[attempt_id] = (buffer, end)
        return end

    async def snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot:
        buffer, end = self._buffers.get(attempt_id, (bytearray(), 0))
        return ScrollbackSnapshot(data=tail_for_replay(bytes(buffer), self.limit), end=end)


def console_scrollback(*, limit: int) -> Scrollback:
    client = shared_redis()
    return RedisScrollback(client, limit=limit) if client is not None else LocalScrollback(limit=limit)
