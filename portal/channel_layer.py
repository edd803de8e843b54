"""channels_redis's channel layer, with a receive that loses no message when its consumer is cancelled mid-pop
(channels_redis #366: the pop runs in a task of its own and its backup is put back first), and with
``group_add``, ``group_send`` and each pop batched into scripts: the same commands, fewer round trips."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field

from channels_redis.core import RedisChannelLayer as UpstreamRedisChannelLayer
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import NoScriptError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Script:
    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())  # noqa: S324 - Redis's own id

    async def run(self, connection, keys: list, args: list):
        """EVALSHA, or EVAL when Redis does not have the script yet (new, restarted, or SCRIPT FLUSHed): EVAL also
        stores it for the next call."""
        try:
            return await connection.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await connection.eval(self.text, len(keys), *keys, *args)


# KEYS[1] the channel, KEYS[2] its backup queue. channels_redis's cleanup (the backup back in front of the channel,
# in order), then the channel's first message moved into the backup and returned; false when the channel is empty.
_RESTORE_AND_POP = _Script("""
local backed_up = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', KEYS[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', KEYS[2])
local popped = redis.call('ZPOPMIN', KEYS[1])
if popped[1] then
    redis.call('ZADD', KEYS[2], popped[2], popped[1])
    return popped[1]
end
return false
""")

# KEYS[1] the group; ARGV[1] the channel, ARGV[2] the time now, ARGV[3] the group's expiry in seconds.
_GROUP_ADD = _Script("""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
""")

# KEYS[1] the group; ARGV[1] the newest score of a member that has expired.
_GROUP_MEMBERS = _Script("""
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
""")

# KEYS the channel keys; ARGV each key's message, then each key's capacity, then the time now, the channels' expiry
# in seconds and the newest score of a message that has expired. channels_redis's group send script, with the
# expiry of old messages (its pipeline before the script) done first for each key.
_GROUP_SEND = _Script("""
local over_capacity = 0
local current_time = ARGV[#ARGV - 2]
local expiry = ARGV[#ARGV - 1]
local expired = ARGV[#ARGV]
for i=1,#KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
""")


# How long a command waits for one of the pool's connections to come free once all are in use.
POOL_WAIT_SECONDS = 10.0


class RedisChannelLayer(UpstreamRedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Per channel key: the pop a cancelled receiver left running, which the next receiver lets finish first.
        self._abandoned_pops: dict[str, asyncio.Future] = {}

    def create_pool(self, index):
        """A pool that, once ``max_connections`` are in use, makes a command wait for one to come free: each command
        here is one short round trip (the receive's BZPOPMIN, one per process, is the only long one), so a few dozen
        connections carry a class's sockets. channels_redis's pool opens a connection per command in flight instead
        (a hundred pages joining their groups at once: a hundred connections, each a connect and a handshake) and
        fails outright past its size. A host given by address or sentinel keeps channels_redis's pool."""
        host = self.hosts[index]
        if "address" in host or "master_name" in host:
            return super().create_pool(index)
        return BlockingConnectionPool(**{"timeout": POOL_WAIT_SECONDS, **host})

    async def group_add(self, group, channel):
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        connection = self.connection(self.consistent_hash(group))
        await _GROUP_ADD.run(connection, [self._group_key(group)], [channel, time.time(), self.group_expiry])

    async def group_send(self, group, message):
        assert self.require_valid_group_name(group), "Group name not valid"
        connection = self.connection(self.consistent_hash(group))
        members = await _GROUP_MEMBERS.run(connection, [self._group_key(group)], [int(time.time()) - self.group_expiry])
        channel_names = [name.decode("utf8") for name in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        for index, channel_keys in by_connection.items():
            now = time.time()
            args = [messages[key] for key in channel_keys] + [capacities[key] for key in channel_keys]
            args += [now, self.expiry, int(now) - int(self.expiry)]
            over_capacity = await _GROUP_SEND.run(self.connection(index), channel_keys, args)
            if over_capacity > 0:
                logger.info("%s of %s channels over capacity in group %s", over_capacity, len(channel_names), group)

    async def _brpop_with_clean(self, index, channel, timeout):  # noqa: ASYNC109 - channels_redis's signature
        backup = self._backup_channel_name(channel)
        connection = self.connection(index)
        member = await _RESTORE_AND_POP.run(connection, [channel, backup], [])
        if member is not None:
            return member
        # Empty: wait for the next message. A cancellation from here on leaves it in the backup at worst.
        result = await connection.bzpopmin(channel, timeout=timeout)
        if result is None:
            return None
        _key, member, score = result
        await connection.zadd(backup, {member: float(score)})
        return member

    async def receive_single(self, channel):
        if "!" not in channel:  # a general channel: no shared pop, nothing of others' to lose
            return await super().receive_single(channel)
        assert self.require_valid_channel_name(channel, receive=True), "Channel name invalid"
        index = self.consistent_hash(channel)
        channel_key = self.prefix + channel
        content = None
        await self.receive_clean_locks.acquire(channel_key)
        try:
            await self._abandoned_pop_finished(channel_key)
            while content is None:
                popping = asyncio.ensure_future(self._brpop_with_clean(index, channel_key, timeout=self.brpop_timeout))
                try:
                    content = await asyncio.shield(popping)
                except asyncio.CancelledError:
                    self._abandon(channel_key, popping)
                    raise
        except BaseException:
            self.receive_clean_locks.release(channel_key)
            raise
        # As channels_redis does: take the message out of the backup queue, then hand the lock on.
        cleaner = asyncio.ensure_future(self._clean_receive_backup(index, channel_key))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Task) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(channel_key)

        cleaner.add_done_callback(cleaned)
        message = self.deserialize(content)
        if "__asgi_channel__" in message:
            channel = message.pop("__asgi_channel__")
        return channel, message

    def _abandon(self, channel_key: str, popping: asyncio.Future) -> None:
        """The receiver left while its pop runs: the pop goes on, and what it takes lands in the backup queue.
        The next receiver waits for it, then (channels_redis's own first step) puts the backup back in front of
        the channel: it neither pops a newer message first nor races the backup copy with a cleaner."""
        self._abandoned_pops[channel_key] = popping

        def finished(done: asyncio.Future) -> None:
            if not done.cancelled():
                done.exception()  # a pop that failed after its receiver left has nobody to tell
            if self._abandoned_pops.get(channel_key) is done:
                del self._abandoned_pops[channel_key]

        popping.add_done_callback(finished)

    async def _abandoned_pop_finished(self, channel_key: str) -> None:
        popping = self._abandoned_pops.get(channel_key)
        # A pop of another event loop (a closed one: tests run one per test) will never finish here.
        if popping is None or popping.done() or popping.get_loop() is not asyncio.get_running_loop():
            return
        # At most one BZPOPMIN timeout: it ends with the first message that arrives, or empty-handed.
        await asyncio.wait({popping}, timeout=self.brpop_timeout + 1)
