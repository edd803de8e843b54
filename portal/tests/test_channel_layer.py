"""The Redis channel layer keeps an idle consumer alive: waiting for a message longer than the client library's
default socket timeout must not raise."""

from __future__ import annotations

import asyncio

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
