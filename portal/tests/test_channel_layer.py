"""The Redis channel layer keeps an idle consumer alive: waiting for a message longer than the client library's
default socket timeout must not raise."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings


# bin/test (and so CI) always sets REDIS_URL, so this runs there; only a run without Redis, whose channel layer is
# the in-memory one with no socket to time out, skips it.
@pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the in-memory layer has no socket to time out")
async def test_a_receive_with_nothing_to_read_outlasts_the_blocking_pop():
    # A layer of its own, configured exactly as the portal's: the process-wide one keeps connections bound to the
    # event loops of earlier tests.
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    channel = await layer.new_channel()
    try:
        # channels_redis blocks 5 s per BZPOPMIN; a read timeout at or below that raised TimeoutError here.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), timeout=7)
    finally:
        await layer.close_pools()



class SlowAnswers:
    """A layer's Redis connection that is slow at one step, as on a loaded event loop: ``pop``, BZPOPMIN's answer
    reaches the layer late (Redis has popped the message, the layer has not read it yet); ``backup``, the backup
    copy of a popped message is written late."""

    def __init__(self, connection, delay: float, slow: str) -> None:
        self._connection = connection
        self._delay = delay
        self._slow = slow

    async def bzpopmin(self, *args, **kwargs):
        result = await self._connection.bzpopmin(*args, **kwargs)
        if self._slow == "pop":
            await asyncio.sleep(self._delay)
        return result

    async def zadd(self, key, *args, **kwargs):
        if self._slow == "backup" and key.endswith("$inflight"):
            await asyncio.sleep(self._delay)
        return await self._connection.zadd(key, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._connection, name)


UPDATE = {"type": "attempt.update", "attempt": {"id": 1, "phase": "Running"}}
LATER = {"type": "attempt.update", "attempt": {"id": 1, "state": "running"}}


async def what_b_receives_after_the_popping_consumer_leaves(layer, slow: str = "pop") -> list[dict]:
    """Consumer A holds the process's receive (it pops for everyone); a message for consumer B is popped by A's
    BZPOPMIN; A's socket closes (its receive is cancelled) while that message is in flight (``slow``), and B's next
    message follows. What does B get, within a few seconds (each idle pop ends after 1 s here)?"""
    layer.brpop_timeout = 1
    connection = layer.connection
    layer.connection = lambda index: SlowAnswers(connection(index), delay=0.3, slow=slow)
    a, b = await layer.new_channel(), await layer.new_channel()
    receiving_for_a = asyncio.create_task(layer.receive(a))
    received = []
    try:
        await asyncio.sleep(0.2)  # A now waits in BZPOPMIN
        await layer.send(b, UPDATE)
        await asyncio.sleep(0.1)  # popped by Redis, not yet read by the layer
        receiving_for_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiving_for_a
        await layer.send(b, LATER)
        with contextlib.suppress(TimeoutError):
            while True:
                received.append(await asyncio.wait_for(layer.receive(b), timeout=3))
    finally:
        await layer.close_pools()
    return received


# Both run where bin/test and CI run (they set REDIS_URL).
@pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the in-memory layer pops from no Redis")
@pytest.mark.parametrize("slow", ["pop", "backup"])
async def test_a_message_popped_for_another_consumer_survives_the_popping_consumer_leaving(slow):
    from portal.channel_layer import RedisChannelLayer as PortalRedisChannelLayer

    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "portal.channel_layer.RedisChannelLayer"
    layer = PortalRedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    # Each once, in order: neither lost nor delivered twice.
    assert await what_b_receives_after_the_popping_consumer_leaves(layer, slow) == [UPDATE, LATER]


@pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the in-memory layer pops from no Redis")
async def test_channels_redis_own_layer_loses_that_message():
    # The window portal.channel_layer closes, shown on channels_redis's own layer: when an upgrade closes it
    # upstream, this fails, and portal.channel_layer can go.
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    assert await what_b_receives_after_the_popping_consumer_leaves(layer) == [LATER]
