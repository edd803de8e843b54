"""Who watches an attempt's console now, so a lone holder skips publishing: registrations that expire unless
refreshed (a Redis sorted set scored by expiry, or a process-local table without Redis)."""

from __future__ import annotations

import time
from typing import Protocol

from labs.console.redis_client import console_key, shared_redis

VIEWER_TTL_SECONDS = 10.0


def viewers_key(attempt_id: int) -> str:
    return console_key("viewers", attempt_id)


class ConsoleViewers(Protocol):
    async def add(self, *, attempt_id: int, viewer: str) -> bool: ...
    async def remove(self, *, attempt_id: int, viewer: str) -> None: ...
    async def others(self, *, attempt_id: int, viewer: str) -> bool: ...


class RedisConsoleViewers:
    def __init__(self, client) -> None:
        self.client = client

    async def add(self, *, attempt_id: int, viewer: str) -> bool:
        """Register (or refresh) the viewer; whether anybody else watches, as of the same round trip."""
        key = viewers_key(attempt_id)
        now = time.time()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {viewer: now + VIEWER_TTL_SECONDS})
            pipe.expire(key, int(VIEWER_TTL_SECONDS * 6))
            pipe.zrangebyscore(key, now, "+inf", start=0, num=2)
            *_, live = await pipe.execute()
        return any(member.decode() != viewer for member in live)

    async def remove(self, *, attempt_id: int, viewer: str) -> None:
        await self.client.zrem(viewers_key(attempt_id), viewer)

    async def others(self, *, attempt_id: int, viewer: str) -> bool:
        live = await self.client.zrangebyscore(viewers_key(attempt_id), time.time(), "+inf", start=0, num=2)
        return any(member.decode() != viewer for member in live)


class LocalConsoleViewers:
    _table: dict[int, dict[str, float]] = {}

    async def add(self, *, attempt_id: int, viewer: str) -> bool:
        self._table.setdefault(attempt_id, {})[viewer] = time.monotonic() + VIEWER_TTL_SECONDS
        return await self.others(attempt_id=attempt_id, viewer=viewer)

    async def remove(self, *, attempt_id: int, viewer: str) -> None:
        self._table.get(attempt_id, {}).pop(viewer, None)

    async def others(self, *, attempt_id: int, viewer: str) -> bool:
        now = time.monotonic()
        return any(name != viewer and expiry > now for name, expiry in self._table.get(attempt_id, {}).items())


def console_viewers() -> ConsoleViewers:
    client = shared_redis()
    return RedisConsoleViewers(client) if client is not None else LocalConsoleViewers()
