"""channels_redis's channel layer, with a receive that loses no message when its consumer goes away mid-pop.

A process receives all its consumers' messages through one Redis sorted set: whichever consumer holds the layer's
receive lock runs BZPOPMIN on it for everyone, and channels_redis copies each popped message to a backup queue, to
be put back if its receiver is cancelled. But the copy is written after BZPOPMIN's answer has been read, so a
cancellation that lands in between, while the answer is on its way or being read, loses the message: it has left
Redis and reached nobody. A consumer is cancelled whenever its socket closes, and under load (a class starting its
labs together, sockets closing as each page gets what it waited for) the event loop lags enough for the answer to
be in flight: a page then never hears that its VM runs (3 of 20 bursts of 100 starts with two daphne processes;
channels_redis issue #366 describes the same window).

Here the pop runs in a task of its own that the consumer's cancellation does not stop. What it pops after its
receiver left goes back in front of the channel (its original score), or is already in the backup queue; the next
receiver lets it finish before it pops itself, so one BZPOPMIN at a time serves the channel, as channels_redis
means it to, and the message reaches its consumer in order, once. Waiting costs the next receiver nothing: the
first message to arrive ends the abandoned pop, which puts it back for the next one to take.
"""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer as UpstreamRedisChannelLayer

# channels_redis's own (core.py, ``_brpop_with_clean``): put backed-up messages back in front of the channel.
RESTORE_BACKUP = """
    local backed_up = redis.call('ZRANGE', ARGV[2], 0, -1, 'WITHSCORES')
    for i = #backed_up, 1, -2 do
        redis.call('ZADD', ARGV[1], backed_up[i], backed_up[i - 1])
    end
    redis.call('DEL', ARGV[2])
"""


class _Pop:
    """One BZPOPMIN on the process's channel, and where its message goes: the backup queue while its receiver
    waits, back in front of the channel (its original score) once the receiver has left."""

    def __init__(self, connection, channel_key: str, backup_key: str, timeout: float) -> None:
        self.connection, self.channel_key, self.backup_key, self.timeout = connection, channel_key, backup_key, timeout
        self.abandoned = False

    async def run(self) -> bytes | None:
        await self.connection.eval(RESTORE_BACKUP, 0, self.channel_key, self.backup_key)
        result = await self.connection.bzpopmin(self.channel_key, timeout=self.timeout)
        if result is None:
            return None
        _key, member, score = result
        if self.abandoned:
            await self.connection.zadd(self.channel_key, {member: float(score)})
            return None
        await self.connection.zadd(self.backup_key, {member: float(score)})
        return member


class RedisChannelLayer(UpstreamRedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Per channel key: the pop a cancelled receiver left running, which the next receiver lets finish first.
        self._abandoned_pops: dict[str, asyncio.Future] = {}

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
                pop = _Pop(self.connection(index), channel_key, self._backup_channel_name(channel_key),
                           self.brpop_timeout)
                popping = asyncio.ensure_future(pop.run())
                try:
                    content = await asyncio.shield(popping)
                except asyncio.CancelledError:
                    pop.abandoned = True
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
        """The receiver left while its pop runs: the pop goes on (whatever it takes goes back in front of the
        channel, or is already in the backup queue) and the next receiver waits for it, so that it neither pops
        a newer message first nor races the backup copy with its own clean-up."""
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
