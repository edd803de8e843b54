"""The Redis channel layer keeps an idle consumer alive (waiting for a message longer than the client library's
default socket timeout must not raise), and lets a leaving consumer end (a cancelled receive returns at once)."""

from __future__ import annotations

import asyncio

import pytest
from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from django.conf import settings

from portal.channel_layer import RedisChannelLayer


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


@pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the portal's Redis layer is not in use")
def test_the_portal_uses_its_own_redis_layer():
    from channels.layers import get_channel_layer

    assert isinstance(get_channel_layer(), RedisChannelLayer)


async def test_a_cancelled_receive_returns_at_once_even_when_the_receive_underneath_loses_the_cancellation(
        monkeypatch):
    """What redis-py under Python 3.11 does now and then: the first cancellation of a receive is lost and it
    goes on. The consumer's receive must still end at once, and the one underneath must be ended too."""
    lost, ended = [], asyncio.Event()

    async def receive_that_loses_a_cancellation(self, channel):
        try:
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    if lost:
                        raise
                    lost.append(channel)
        finally:
            ended.set()

    monkeypatch.setattr(BaseRedisChannelLayer, "receive", receive_that_loses_a_cancellation)
    layer = RedisChannelLayer(hosts=[{"address": settings.REDIS_URL or "redis://127.0.0.1:6379/0"}])
    receiving = asyncio.create_task(layer.receive("specific.test!abc"))
    await asyncio.sleep(0.05)
    receiving.cancel()
    await asyncio.wait([receiving], timeout=0.5)
    assert receiving.cancelled()
    await asyncio.wait_for(ended.wait(), 2)
    assert lost == ["specific.test!abc"]
    await asyncio.sleep(0)
    assert not layer._abandoned


@pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the in-memory layer has no socket to time out")
async def test_a_message_sent_reaches_a_receive_through_the_portal_layer():
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    channel = await layer.new_channel()
    try:
        await layer.send(channel, {"type": "attempt.update", "n": 7})
        assert (await asyncio.wait_for(layer.receive(channel), timeout=5))["n"] == 7
    finally:
        await layer.close_pools()
