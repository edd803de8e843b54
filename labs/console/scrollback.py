"""Recent console output per attempt, replayed to a tab that (re)connects, with a running byte offset.

Every chunk of output gets the offset just past it (``end``). A viewer that replays a snapshot ending at
``end`` skips chunks it already has, so a snapshot taken while output flows is neither doubled nor torn.
With Redis the buffer lives there (any process may hold the upstream next); otherwise in this process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from labs.console.redis_client import shared_redis

# Keys expire a day after the last output: long enough for a student to come back, short enough to clean up.
SCROLLBACK_EXPIRY_SECONDS = 24 * 3600

# Append, count, and trim the buffer once it holds twice the limit, so trimming costs O(1) amortised.
_APPEND = """
local length = redis.call('APPEND', KEYS[1], ARGV[1])
local finish = redis.call('INCRBY', KEYS[2], string.len(ARGV[1]))
local limit = tonumber(ARGV[2])
if length > 2 * limit then
  redis.call('SET', KEYS[1], redis.call('GETRANGE', KEYS[1], length - limit, -1))
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return finish
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
    return tail[newline + 1:] if newline >= 0 else tail


class Scrollback(Protocol):
    async def append(self, *, attempt_id: int, data: bytes) -> int: ...
    async def snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot: ...


def _keys(attempt_id: int) -> tuple[str, str]:
    return f"portal:console:scrollback:{attempt_id}", f"portal:console:offset:{attempt_id}"


class RedisScrollback:
    def __init__(self, client, *, limit: int) -> None:
        self.client = client
        self.limit = limit

    async def append(self, *, attempt_id: int, data: bytes) -> int:
        return int(await self.client.eval(_APPEND, 2, *_keys(attempt_id), data, self.limit, SCROLLBACK_EXPIRY_SECONDS))

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
