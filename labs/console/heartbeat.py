"""One round trip per period keeps every console of this process current in Redis: its holders' leases, its
viewers' registrations, and whether anybody else watches each holder. A lease someone else took is reported lost;
without Redis (the embedded mode) the same runs against process-local tables."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from redis.commands.core import AsyncScript

from labs.console.lease import LocalConsoleLease, lease_key
from labs.console.redis_client import shared_redis
from labs.console.viewers import VIEWER_TTL_SECONDS, LocalConsoleViewers, viewers_key

logger = logging.getLogger(__name__)

# KEYS: for each held lease its lease key and its viewers key, then the viewers key of each registration.
# ARGV: held count, lease ttl (ms), registration expiry (score), viewers key expiry (s), now (score), then the
# holders, then the registered viewers. Returns, per held lease, its state (1 renewed, 2 had expired and was taken
# again, 0 somebody else holds it) and whether anybody else watches (0/1).
_BEAT = """
local held = tonumber(ARGV[1])
local first_viewer = 6 + held
for j = 2 * held + 1, #KEYS do
  redis.call('ZADD', KEYS[j], ARGV[3], ARGV[first_viewer + j - 2 * held - 1])
  redis.call('EXPIRE', KEYS[j], ARGV[4])
end
local result = {}
for i = 1, held do
  local key, holder = KEYS[2 * i - 1], ARGV[5 + i]
  local current = redis.call('GET', key)
  local state = 0
  if current == holder then
    redis.call('PEXPIRE', key, ARGV[2])
    state = 1
  elseif not current then
    redis.call('SET', key, holder, 'PX', ARGV[2])
    state = 2
  end
  local others = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2 * i], ARGV[5], '+inf', 'LIMIT', 0, 2)) do
    if member ~= holder then
      others = 1
    end
  end
  result[2 * i - 1] = state
  result[2 * i] = others
end
return result
"""


@dataclass(eq=False)
class HeldLease:
    """A lease this process holds. ``on_lost()`` is called if somebody else holds it now; ``on_others(others,
    as_of)`` after every beat with whether anybody else watches, as of the beat's start (``time.monotonic()``)."""

    attempt_id: int
    holder: str
    on_lost: Callable[[], None]
    on_others: Callable[[bool, float], None]
    lost: bool = False


class ConsoleHeartbeat:
    def __init__(self, *, client, ttl: float) -> None:
        self.client = client
        # Without Redis: the process-local tables, renewed one by one (no round trips to save).
        self.lease = LocalConsoleLease()
        self.viewers = LocalConsoleViewers()
        self.ttl = ttl
        self.period = ttl / 3
        self.held: set[HeldLease] = set()
        self.watching: set[tuple[int, str]] = set()
        self.task: asyncio.Task | None = None
        self.script = client.register_script(_BEAT) if client is not None else None

    # -- registration ---------------------------------------------------------------------------------------

    def watch(self, *, attempt_id: int, viewer: str) -> None:
        """Keep ``viewer``'s registration alive (it registered itself once already, at connect)."""
        self.watching.add((attempt_id, viewer))
        self._ensure_running()

    def unwatch(self, *, attempt_id: int, viewer: str) -> None:
        self.watching.discard((attempt_id, viewer))
        self._stop_when_idle()

    def hold(
        self, *, attempt_id: int, holder: str, on_lost: Callable[[], None], on_others: Callable[[bool, float], None]
    ) -> HeldLease:
        """Renew a lease just acquired, until ``release``."""
        held = HeldLease(attempt_id=attempt_id, holder=holder, on_lost=on_lost, on_others=on_others)
        self.held.add(held)
        self._ensure_running()
        return held

    def release(self, held: HeldLease) -> None:
        self.held.discard(held)
        self._stop_when_idle()

    def _ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="console-heartbeat")

    def _stop_when_idle(self) -> None:
        if not self.held and not self.watching and self.task is not None:
            self.task.cancel()
            self.task = None

    # -- beating --------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        # Until stopped or replaced: a cancellation that lands in a Redis call can be lost (portal.waiting).
        while self.task is asyncio.current_task():
            await asyncio.sleep(self.period)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis briefly unreachable, say: the leases last a few periods; try again at the next one.
                logger.exception("Console heartbeat failed; retrying")

    async def beat(self) -> None:
        """Renew, register and look, for every console of this process at once."""
        held, watching = list(self.held), list(self.watching)
        started = time.monotonic()
        if self.script is not None:
            results = await self._beat_redis(self.script, held, watching)
        else:
            results = await self._beat_local(held, watching)
        for lease, (state, others) in zip(held, results, strict=True):
            if lease not in self.held:
                continue  # released while the beat was under way
            if state == 0:
                logger.warning("Console %s: lease lost; handing the upstream over", lease.attempt_id)
                lease.lost = True
                self.held.discard(lease)
                lease.on_lost()
                continue
            if state == 2:
                logger.warning("Console %s: lease had expired; taken again", lease.attempt_id)
            lease.on_others(bool(others), started)

    async def _beat_redis(
        self, script: AsyncScript, held: list[HeldLease], watching: list[tuple[int, str]]
    ) -> list[tuple[int, int]]:
        now = time.time()
        keys = [key for lease in held for key in (lease_key(lease.attempt_id), viewers_key(lease.attempt_id))]
        keys += [viewers_key(attempt_id) for attempt_id, _ in watching]
        args: list[float | str] = [
            len(held),
            int(self.ttl * 1000),
            now + VIEWER_TTL_SECONDS,
            int(VIEWER_TTL_SECONDS * 6),
            now,
        ]
        args += [lease.holder for lease in held] + [viewer for _, viewer in watching]
        flat = await script(keys=keys, args=args)
        return [(int(flat[2 * i]), int(flat[2 * i + 1])) for i in range(len(held))]

    async def _beat_local(self, held: list[HeldLease], watching: list[tuple[int, str]]) -> list[tuple[int, int]]:
        for attempt_id, viewer in watching:
            await self.viewers.add(attempt_id=attempt_id, viewer=viewer)
        results = []
        for lease in held:
            if await self.lease.renew(attempt_id=lease.attempt_id, holder=lease.holder, ttl=self.ttl):
                state = 1
            elif await self.lease.acquire(attempt_id=lease.attempt_id, holder=lease.holder, ttl=self.ttl):
                state = 2
            else:
                state = 0
            others = await self.viewers.others(attempt_id=lease.attempt_id, viewer=lease.holder)
            results.append((state, int(others)))
        return results


_heartbeats: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, ConsoleHeartbeat]] = (
    weakref.WeakKeyDictionary()
)


def console_heartbeat(*, ttl: float) -> ConsoleHeartbeat:
    """The running loop's heartbeat for leases of ``ttl`` seconds (one per process in production)."""
    beats = _heartbeats.setdefault(asyncio.get_running_loop(), {})
    heartbeat = beats.get(ttl)
    if heartbeat is None:
        client = shared_redis()
        heartbeat = beats[ttl] = ConsoleHeartbeat(client=client, ttl=ttl)
    return heartbeat
