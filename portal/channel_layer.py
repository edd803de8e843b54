"""The channel layers: channels_redis's, whose receive loses no message when its consumer is cancelled mid-pop
(channels_redis #366); and Channels' in-memory one (the embedded default's), which forgets an ended consumer."""

from __future__ import annotations

import asyncio

from channels import layers
from channels_redis.core import RedisChannelLayer as UpstreamRedisChannelLayer
from redis.asyncio import BlockingConnectionPool

# How long a command waits for one of the pool's connections to come free once all are in use.
POOL_WAIT_SECONDS = 10.0


class RedisChannelLayer(UpstreamRedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Per channel key: the pop a cancelled receiver left running, which the next receiver lets finish first.
        self._abandoned_pops: dict[str, asyncio.Future] = {}

    def create_pool(self, index):
        """A pool that makes a command wait for a free connection once ``max_connections`` are in use, where
        channels_redis's opens one per command in flight and fails past its size. Address or sentinel hosts keep
        channels_redis's pool."""
        host = self.hosts[index]
        if "address" in host or "master_name" in host:
            return super().create_pool(index)
        return BlockingConnectionPool(**{"timeout": POOL_WAIT_SECONDS, **host})

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
        """The receiver left while its pop runs: the pop goes on into the backup queue, which the next receiver waits
        for and then puts back in front of the channel (channels_redis's own first step)."""
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


class InMemoryChannelLayer(layers.InMemoryChannelLayer):
    """Drops a consumer's queue and groups as soon as it ends (``discard_channel``, from ``portal.websockets``):
    an idle process would otherwise keep them (channels_redis lets them expire unread)."""

    extensions = [*layers.InMemoryChannelLayer.extensions, "discard_channel"]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # The process-specific channels whose consumers still run (every receiver here was made by new_channel).
        self.open_channels: set[str] = set()

    async def new_channel(self, prefix: str = "specific.") -> str:
        channel = await super().new_channel(prefix)
        self.open_channels.add(channel)
        return channel

    async def send(self, channel: str, message: dict) -> None:
        if "!" in channel and channel not in self.open_channels:
            return  # its consumer has ended: nobody will ever read it
        await super().send(channel, message)

    async def discard_channel(self, channel: str) -> None:
        """The consumer reading ``channel`` has ended: drop its queue and its group memberships."""
        self.open_channels.discard(channel)
        self.channels.pop(channel, None)
        for group in list(self.groups):
            await self.group_discard(group, channel)
