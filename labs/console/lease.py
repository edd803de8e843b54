"""Which viewer holds an attempt's upstream console connection: a Redis key with the holder's channel and a TTL it
renews, so another viewer takes over when a process dies; a process-local table without Redis (embedded mode)."""

from __future__ import annotations

import time
from typing import Protocol

from labs.console.redis_client import console_key, shared_redis

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Taken, or already ours: an acquire whose answer was lost on the way (a cancelled or failed call) is repeated.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def lease_key(attempt_id: int) -> str:
    return console_key("lease", attempt_id)


class ConsoleLease(Protocol):
    async def acquire(self, *, attempt_id: int, holder: str, ttl: float) -> bool: ...
    async def renew(self, *, attempt_id: int, holder: str, ttl: float) -> bool: ...
    async def release(self, *, attempt_id: int, holder: str) -> None: ...
    async def holder(self, *, attempt_id: int) -> str | None: ...


class RedisConsoleLease:
    def __init__(self, client) -> None:
        self.client = client

    async def acquire(self, *, attempt_id: int, holder: str, ttl: float) -> bool:
        return bool(await self.client.eval(_ACQUIRE, 1, lease_key(attempt_id), holder, int(ttl * 1000)))

    async def renew(self, *, attempt_id: int, holder: str, ttl: float) -> bool:
        return bool(await self.client.eval(_RENEW, 1, lease_key(attempt_id), holder, int(ttl * 1000)))

    async def release(self, *, attempt_id: int, holder: str) -> None:
        await self.client.eval(_RELEASE, 1, lease_key(attempt_id), holder)

    async def holder(self, *, attempt_id: int) -> str | None:
        value = await self.client.get(lease_key(attempt_id))
        return value.decode() if value is not None else None


class LocalConsoleLease:
    """Process-local leases; correct only when one process serves every viewer (the in-memory channel layer)."""

    _table: dict[int, tuple[str, float]] = {}

    def _current(self, attempt_id: int) -> str | None:
        entry = self._table.get(attempt_id)
        if entry is None:
            return None
        holder, deadline = entry
        if deadline < time.monotonic():
            del self._table[attempt_id]
            return None
        return holder

    async def acquire(self, *, attempt_id: int, holder: str, ttl: float) -> bool:
        if self._current(attempt_id) not in (None, holder):
            return False
        self._table[attempt_id] = (holder, time.monotonic() + ttl)
        return True

    async def renew(self, *, attempt_id: int, holder: str, ttl: float) -> bool:
        if self._current(attempt_id) != holder:
            return False
        self._table[attempt_id] = (holder, time.monotonic() + ttl)
        return True

    async def release(self, *, attempt_id: int, holder: str) -> None:
        if self._current(attempt_id) == holder:
            del self._table[attempt_id]

    async def holder(self, *, attempt_id: int) -> str | None:
        return self._current(attempt_id)


def console_lease() -> ConsoleLease:
    client = shared_redis()
    return RedisConsoleLease(client) if client is not None else LocalConsoleLease()
