"""The portal's Redis channel layer: an idle consumer stays alive (waiting longer than the client library's default
socket timeout must not raise), no message is lost when a consumer leaves mid-pop, and group joins share the pool's
few connections."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

import pytest
import redis
from channels_redis.core import RedisChannelLayer
from django.conf import settings

# Every test here talks to Redis. bin/test (and so CI) always sets REDIS_URL, so they run there; only a run without
# Redis, whose channel layer is the in-memory one, skips them.
pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: the in-memory layer uses no Redis")


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


@pytest.mark.parametrize("slow", ["pop", "backup"])
async def test_a_message_popped_for_another_consumer_survives_the_popping_consumer_leaving(slow):
    from portal.channel_layer import RedisChannelLayer as PortalRedisChannelLayer

    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "portal.channel_layer.RedisChannelLayer"
    layer = PortalRedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    # Each once, in order: neither lost nor delivered twice.
    assert await what_b_receives_after_the_popping_consumer_leaves(layer, slow) == [UPDATE, LATER]


async def test_channels_redis_own_layer_loses_that_message():
    # The window portal.channel_layer closes, shown on channels_redis's own layer: when an upgrade closes it
    # upstream, this fails, and portal.channel_layer can go.
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    assert await what_b_receives_after_the_popping_consumer_leaves(layer) == [LATER]


# --- groups and pops --------------------------------------------------------------------------------------------


def portal_layer(**overrides):
    from portal.channel_layer import RedisChannelLayer as PortalRedisChannelLayer

    return PortalRedisChannelLayer(**{**settings.CHANNEL_LAYERS["default"]["CONFIG"], **overrides})


async def received_within(layer, channel: str, seconds: float = 2) -> list[dict]:
    messages = []
    with contextlib.suppress(TimeoutError):
        while True:
            messages.append(await asyncio.wait_for(layer.receive(channel), timeout=seconds))
    return messages


@pytest.fixture
async def make_layer():
    """Layers configured as the portal's (``portal_layer``), each pop waiting at most 1 s; their pools closed after."""
    made = []

    def make(**overrides):
        layer = portal_layer(**overrides)
        layer.brpop_timeout = 1
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.close_pools()


async def test_group_send_reaches_each_member_of_every_process_once(make_layer):
    web, other = make_layer(), make_layer()  # two processes: each its own channel key
    group = f"attempt-{secrets.token_hex(4)}"
    members = [await web.new_channel(), await web.new_channel(), await other.new_channel()]

    def layer_of(channel: str):
        return other if channel.startswith(f"specific.{other.client_prefix}") else web

    for channel in members:
        await layer_of(channel).group_add(group, channel)
    sender = make_layer()
    await sender.group_send(group, UPDATE)
    await sender.group_send(group, UPDATE)
    for channel in members:
        assert await received_within(layer_of(channel), channel, seconds=1.5) == [UPDATE, UPDATE], channel


async def test_group_add_joins_and_sets_the_groups_expiry(make_layer):
    layer = make_layer()
    group = f"console-{secrets.token_hex(4)}"
    channel = await layer.new_channel()
    joined = time.time()
    await layer.group_add(group, channel)
    connection = layer.connection(0)
    key = layer._group_key(group)
    assert abs(await connection.zscore(key, channel) - joined) < 1
    assert layer.group_expiry - 2 <= await connection.ttl(key) <= layer.group_expiry


async def test_group_send_drops_expired_members_and_messages_and_respects_capacity(make_layer):
    layer = make_layer(capacity=2)
    group = f"attempt-{secrets.token_hex(4)}"
    live, gone = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, live)
    await layer.group_add(group, gone)
    connection = layer.connection(0)
    group_key = layer._group_key(group)
    # A member added longer ago than group_expiry: dropped, not sent to.
    await connection.zadd(group_key, {gone: time.time() - layer.group_expiry - 5})
    channel_key = layer.prefix + layer.non_local_name(live)
    # A message older than the channels' expiry waits in the channel: dropped before the send counts capacity.
    stale = layer.serialize({**UPDATE, "__asgi_channel__": [live]})
    await connection.zadd(channel_key, {stale: time.time() - layer.expiry - 5})
    for number in range(3):
        await layer.group_send(group, {**LATER, "number": number})
    assert await connection.zrange(group_key, 0, -1) == [live.encode()]
    received = await received_within(layer, live, seconds=1.5)
    # Capacity 2: the third message found the channel full.
    assert received == [{**LATER, "number": 0}, {**LATER, "number": 1}]
    assert await received_within(layer, gone, seconds=1.2) == []


# --- a pop when messages are waiting ----------------------------------------------------------------------------


async def test_waiting_messages_are_received_in_order_and_their_backup_cleared(make_layer):
    layer = make_layer()
    channel = await layer.new_channel()
    for number in range(3):
        await layer.send(channel, {**LATER, "number": number})
    received = [await asyncio.wait_for(layer.receive(channel), timeout=3) for _ in range(3)]
    assert received == [{**LATER, "number": number} for number in range(3)]
    await asyncio.sleep(0.1)  # the last message's backup is cleared after it is handed over
    assert await layer.connection(0).zcard(layer.prefix + layer.non_local_name(channel) + "$inflight") == 0


async def test_a_waiting_message_popped_for_a_receiver_that_leaves_reaches_the_next_once(make_layer):
    layer = make_layer()
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.send(b, UPDATE)
    connection = layer.connection
    layer.connection = lambda index: SlowAnswers(connection(index), delay=0.3, slow="pop")
    receiving_for_a = asyncio.create_task(layer.receive(a))  # pops for everyone: takes B's message
    await asyncio.sleep(0.1)  # Redis has popped the message, its answer on its way
    receiving_for_a.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await receiving_for_a
    layer.connection = connection
    await layer.send(b, LATER)
    assert await received_within(layer, b, seconds=2) == [UPDATE, LATER]


async def test_a_hundred_group_joins_at_once_share_the_pools_few_connections(make_layer):
    size = 8  # the portal's own is CHANNEL_LAYER_MAX_CONNECTIONS; a small one makes the bound plain
    host = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]
    # Its connections carry a name of their own: other test processes share the Redis server.
    name = f"joins-{secrets.token_hex(4)}"
    layer = make_layer(hosts=[{**host, "max_connections": size, "client_name": name}])
    channels = [await layer.new_channel() for _ in range(100)]
    group = name
    server = redis.Redis.from_url(settings.REDIS_URL)
    await asyncio.gather(*(layer.group_add(group, channel) for channel in channels))
    # Every join got through, over no more connections than the pool's size (channels_redis's pool opens one per
    # command in flight, and keeps them: a hundred here, or fails past its size).
    opened = [client for client in server.client_list() if client.get("name") == name]
    assert 1 <= len(opened) <= size
    assert await layer.connection(0).zcard(layer._group_key(group)) == 100
    await layer.group_send(group, UPDATE)
    assert all([await received_within(layer, channel, seconds=2) == [UPDATE] for channel in channels[:3]])
