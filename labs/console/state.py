"""What every viewer of an attempt's console shares, across processes: the lease of the one holding the upstream, who
watches, who holds the keyboard, the guest's size and the scrollback. In Redis, or in this process without it."""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass

import redis.asyncio as redis_asyncio
from django.conf import settings

from portal.redis_async import pool_options

# Past CONSOLE_REDIS_MAX_CONNECTIONS a command waits this long for a connection instead of failing at once.
CONNECTION_WAIT_SECONDS = 10.0
VIEWER_TTL_SECONDS = 10.0
# Scrollback and size expire a day after they were last written: long enough for a student to come back.
EXPIRY_SECONDS = 24 * 3600
DEFAULT_SIZE = (80, 24)  # (cols, rows): kubesim's pty; a serial port nobody sized reads as 80x24 to programs

# Already ours (1, renewed; also an acquire whose answer was lost, repeated), free (2, taken) or somebody else's (0).
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# Append, count, and trim the buffer once it holds twice its limit, so trimming costs O(1) amortised.
_APPEND = """
local limit = tonumber(ARGV[2])
local length = redis.call('APPEND', KEYS[1], ARGV[1])
local end_offset = redis.call('INCRBY', KEYS[2], string.len(ARGV[1]))
if length > 2 * limit then
  redis.call('SET', KEYS[1], redis.call('GETRANGE', KEYS[1], length - limit, -1))
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return end_offset
"""

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis_asyncio.Redis] = weakref.WeakKeyDictionary()


def console_key(kind: str, attempt_id: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}portal:console:{kind}:{attempt_id}"


def shared_redis() -> redis_asyncio.Redis | None:
    """The running loop's client (a connection belongs to the loop that opened it), None without REDIS_URL."""
    if not settings.REDIS_URL:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        # Cancellable connections (portal.redis_async): a closing tab cancels its tasks mid-command.
        pool = redis_asyncio.BlockingConnectionPool(
            **pool_options(
                settings.REDIS_URL,
                health_check_interval=30,
                timeout=CONNECTION_WAIT_SECONDS,
                max_connections=settings.CONSOLE_REDIS_MAX_CONNECTIONS,
                **settings.REDIS_CONNECTION_OPTIONS,
            )
        )
        client = _clients[loop] = redis_asyncio.Redis(connection_pool=pool)
    return client


@dataclass(frozen=True)
class ScrollbackSnapshot:
    data: bytes
    end: int  # the running offset just past ``data``


def tail_for_replay(data: bytes, limit: int) -> bytes:
    """The last ``limit`` bytes, starting at a line boundary when one is near so replay starts cleanly."""
    if len(data) <= limit:
        return data
    tail = data[-limit:]
    newline = tail.find(b"\n", 0, 1024)
    return tail[newline + 1 :] if newline >= 0 else tail


class _ConsoleState(ABC):
    """What is written once over either store's plain values: the keyboard holder and the size."""

    @abstractmethod
    async def get(self, kind: str, attempt_id: int) -> str | None: ...
    @abstractmethod
    async def put(self, kind: str, attempt_id: int, value: str, *, ttl: float) -> None: ...
    @abstractmethod
    async def delete(self, kind: str, attempt_id: int) -> None: ...

    async def control_holder(self, *, attempt_id: int) -> dict | None:
        """``{"by": channel, "who": name}`` of the staff member holding the keyboard, or None."""
        raw = await self.get("control", attempt_id)
        return json.loads(raw) if raw else None

    async def control_take(self, *, attempt_id: int, by: str, who: str, ttl: float) -> None:
        """Take (or renew) the keyboard; a colleague who held it loses it."""
        await self.put("control", attempt_id, json.dumps({"by": by, "who": who}), ttl=ttl)

    async def control_release(self, *, attempt_id: int, by: str) -> None:
        holder = await self.control_holder(attempt_id=attempt_id)
        if holder is not None and holder.get("by") == by:
            await self.delete("control", attempt_id)

    async def size_get(self, *, attempt_id: int) -> tuple[int, int]:
        """The guest console's (cols, rows) as last set through the portal, else the guest's default."""
        try:
            cols, rows = (int(part) for part in (await self.get("size", attempt_id) or "").split("x"))
        except ValueError:  # none set yet
            return DEFAULT_SIZE
        return cols, rows

    async def size_set(self, *, attempt_id: int, cols: int, rows: int) -> None:
        await self.put("size", attempt_id, f"{cols}x{rows}", ttl=EXPIRY_SECONDS)


class RedisConsoleState(_ConsoleState):
    def __init__(self, client) -> None:
        self.client = client
        self.append = client.register_script(_APPEND)

    async def get(self, kind: str, attempt_id: int) -> str | None:
        value = await self.client.get(console_key(kind, attempt_id))
        return value.decode() if value is not None else None

    async def put(self, kind: str, attempt_id: int, value: str, *, ttl: float) -> None:
        await self.client.set(console_key(kind, attempt_id), value, px=int(ttl * 1000))

    async def delete(self, kind: str, attempt_id: int) -> None:
        await self.client.delete(console_key(kind, attempt_id))

    async def lease_acquire(self, *, attempt_id: int, holder: str, ttl: float) -> int:
        """Take the lease, or renew it if ``holder`` has it: 2 taken, 1 renewed, 0 somebody else holds it."""
        return int(await self.client.eval(_ACQUIRE, 1, console_key("lease", attempt_id), holder, int(ttl * 1000)))

    async def lease_release(self, *, attempt_id: int, holder: str) -> None:
        await self.client.eval(_RELEASE, 1, console_key("lease", attempt_id), holder)

    async def viewer_add(self, *, attempt_id: int, viewer: str) -> bool:
        """Register (or refresh) the viewer; whether anybody else watches, as of the same round trip."""
        key = console_key("viewers", attempt_id)
        now = time.time()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {viewer: now + VIEWER_TTL_SECONDS})
            pipe.expire(key, int(VIEWER_TTL_SECONDS * 6))
            pipe.zrangebyscore(key, now, "+inf", start=0, num=2)
            *_, live = await pipe.execute()
        return any(member.decode() != viewer for member in live)

    async def viewer_remove(self, *, attempt_id: int, viewer: str) -> None:
        await self.client.zrem(console_key("viewers", attempt_id), viewer)

    async def viewers_others(self, *, attempt_id: int, viewer: str) -> bool:
        key = console_key("viewers", attempt_id)
        live = await self.client.zrangebyscore(key, time.time(), "+inf", start=0, num=2)
        return any(member.decode() != viewer for member in live)

    async def scrollback_append(self, *, attempt_id: int, data: bytes) -> int:
        """Append output; the running offset just past it."""
        keys = [console_key("scrollback", attempt_id), console_key("offset", attempt_id)]
        return int(await self.append(keys=keys, args=[data, settings.CONSOLE_SCROLLBACK_BYTES, EXPIRY_SECONDS]))

    async def scrollback_snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot:
        data, end = await self.client.mget(console_key("scrollback", attempt_id), console_key("offset", attempt_id))
        limit = settings.CONSOLE_SCROLLBACK_BYTES
        return ScrollbackSnapshot(data=tail_for_replay(bytes(data or b""), limit), end=int(end or 0))


class LocalConsoleState(_ConsoleState):
    """The same in this process's memory: correct only when one process serves every viewer (the embedded mode)."""

    values: dict[str, tuple[str, float]] = {}  # key: (value, expiry on time.monotonic())
    viewers: dict[int, dict[str, float]] = {}
    scrollbacks: dict[int, tuple[bytearray, int]] = {}

    async def get(self, kind: str, attempt_id: int) -> str | None:
        value, expiry = self.values.get(console_key(kind, attempt_id), ("", 0.0))
        return value if expiry > time.monotonic() else None

    async def put(self, kind: str, attempt_id: int, value: str, *, ttl: float) -> None:
        self.values[console_key(kind, attempt_id)] = (value, time.monotonic() + ttl)

    async def delete(self, kind: str, attempt_id: int) -> None:
        self.values.pop(console_key(kind, attempt_id), None)

    async def lease_acquire(self, *, attempt_id: int, holder: str, ttl: float) -> int:
        current = await self.get("lease", attempt_id)
        if current not in (None, holder):
            return 0
        await self.put("lease", attempt_id, holder, ttl=ttl)
        return 1 if current == holder else 2

    async def lease_release(self, *, attempt_id: int, holder: str) -> None:
        if await self.get("lease", attempt_id) == holder:
            await self.delete("lease", attempt_id)

    async def viewer_add(self, *, attempt_id: int, viewer: str) -> bool:
        self.viewers.setdefault(attempt_id, {})[viewer] = time.monotonic() + VIEWER_TTL_SECONDS
        return await self.viewers_others(attempt_id=attempt_id, viewer=viewer)

    async def viewer_remove(self, *, attempt_id: int, viewer: str) -> None:
        self.viewers.get(attempt_id, {}).pop(viewer, None)

    async def viewers_others(self, *, attempt_id: int, viewer: str) -> bool:
        now = time.monotonic()
        return any(name != viewer and expiry > now for name, expiry in self.viewers.get(attempt_id, {}).items())

    async def scrollback_append(self, *, attempt_id: int, data: bytes) -> int:
        buffer, end = self.scrollbacks.get(attempt_id, (bytearray(), 0))
        buffer += data
        if len(buffer) > 2 * settings.CONSOLE_SCROLLBACK_BYTES:
            del buffer[: len(buffer) - settings.CONSOLE_SCROLLBACK_BYTES]
        self.scrollbacks[attempt_id] = (buffer, end + len(data))
        return end + len(data)

    async def scrollback_snapshot(self, *, attempt_id: int) -> ScrollbackSnapshot:
        buffer, end = self.scrollbacks.get(attempt_id, (bytearray(), 0))
        return ScrollbackSnapshot(data=tail_for_replay(bytes(buffer), settings.CONSOLE_SCROLLBACK_BYTES), end=end)


def console_state() -> RedisConsoleState | LocalConsoleState:
    client = shared_redis()
    return RedisConsoleState(client) if client is not None else LocalConsoleState()
