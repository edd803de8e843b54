"""``portal.redis_async``: asyncio Redis connections whose writes never lose the caller's cancellation, and the
pools of ours that use them."""

from __future__ import annotations

import asyncio

import pytest
from channels_redis.utils import create_pool
from django.conf import settings
from redis import exceptions
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection

from labs.console.state import shared_redis
from portal.redis_async import (
    CancellableConnection,
    CancellableSSLConnection,
    CancellableUnixConnection,
    pool_options,
)

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: nothing here reaches Redis")


async def connected(connection_class) -> Connection:
    options = pool_options(settings.REDIS_URL, socket_timeout=5, health_check_interval=0)
    options.pop("connection_class")
    connection = connection_class(**options)
    await connection.connect()
    return connection


async def cancelled_as_the_write_finishes(connection: Connection) -> asyncio.Task:
    """A task sends PING and then waits; the task is cancelled by the write itself, at its very end: the turn of
    the event loop in which the bytes went out."""
    write = connection._send_packed_command

    async def write_then_cancel(command):
        await write(command)
        caller.cancel()

    connection._send_packed_command = write_then_cancel

    async def send_then_wait() -> None:
        await connection.send_packed_command(connection.pack_command("PING"))
        await asyncio.sleep(30)

    caller = asyncio.create_task(send_then_wait())
    await asyncio.wait([caller], timeout=2)
    return caller


@needs_redis
async def test_a_cancellation_landing_as_the_write_finishes_reaches_the_caller():
    connection = await connected(CancellableConnection)
    try:
        caller = await cancelled_as_the_write_finishes(connection)
        assert caller.done() and caller.cancelled()
    finally:
        await connection.disconnect()


@needs_redis
async def test_redis_pys_own_connection_loses_that_cancellation():
    """What the class exists for: redis-py writes under asyncio.wait_for, which returns the write's result and
    drops the cancellation. If a redis-py or Python release stops doing that, this test says so."""
    connection = await connected(Connection)
    caller = await cancelled_as_the_write_finishes(connection)
    try:
        assert not caller.done(), "the cancellation arrived: portal.redis_async may no longer be needed"
    finally:
        caller.cancel()
        await asyncio.wait([caller], timeout=2)
        await connection.disconnect()


@needs_redis
async def test_a_write_past_the_socket_timeout_fails_as_redis_py_fails_it():
    connection = await connected(CancellableConnection)
    connection.socket_timeout = 0.05

    async def stuck(command):
        await asyncio.sleep(30)

    connection._send_packed_command = stuck
    with pytest.raises(exceptions.TimeoutError, match="Timeout writing to socket"):
        await connection.send_packed_command(connection.pack_command("PING"))
    assert not connection.is_connected


@needs_redis
async def test_a_cancelled_write_leaves_no_half_sent_command_on_the_connection():
    connection = await connected(CancellableConnection)

    async def stuck(command):
        await asyncio.sleep(30)

    connection._send_packed_command = stuck
    caller = asyncio.create_task(connection.send_packed_command(connection.pack_command("PING")))
    await asyncio.sleep(0.05)
    caller.cancel()
    await asyncio.wait([caller], timeout=2)
    assert caller.cancelled()
    assert not connection.is_connected


@needs_redis
async def test_commands_go_through_as_before():
    connection = await connected(CancellableConnection)
    try:
        await connection.send_command("SET", "redis-async-probe", "1", "EX", "5")
        assert await connection.read_response() == b"OK"
        await connection.send_command("GET", "redis-async-probe")
        assert await connection.read_response() == b"1"
    finally:
        await connection.disconnect()


@pytest.mark.parametrize(
    "url, connection_class, where",
    [
        (
            "redis://:secret@cache.example:6380/3",
            CancellableConnection,
            {"host": "cache.example", "port": 6380, "db": 3},
        ),
        ("rediss://cache.example/2", CancellableSSLConnection, {"host": "cache.example", "db": 2}),
        ("unix:///run/redis.sock?db=4", CancellableUnixConnection, {"path": "/run/redis.sock", "db": 4}),
    ],
)
def test_pool_options_keep_the_url_and_pick_the_class_for_its_scheme(url, connection_class, where):
    options = pool_options(url, socket_timeout=30, max_connections=10)
    assert options["connection_class"] is connection_class
    assert options["socket_timeout"] == 30 and options["max_connections"] == 10
    assert {key: options[key] for key in where} == where
    if url.startswith("redis://"):
        assert options["password"] == "secret"


def test_a_url_of_another_scheme_is_refused():
    with pytest.raises(ValueError, match="redis://, rediss://, unix://"):
        pool_options("http://cache.example")


@needs_redis
async def test_a_new_connection_does_not_ask_for_maintenance_notifications():
    """redis-py 8 asks each new RESP3 connection for maintenance notifications, which Redis refuses with an error
    (a Redis Enterprise and Cloud command); the portal's pools do not ask: one error reply fewer per connection than
    with redis-py's default (Redis before 7.2 also refuses the client-library names both send)."""
    import redis

    stats = redis.Redis.from_url(settings.REDIS_URL)

    try:
        ours = pool_options(settings.REDIS_URL, socket_timeout=5, health_check_interval=0)
        default = {key: value for key, value in ours.items() if key != "maint_notifications_config"}
        counts = []
        for options in (ours, default):
            before = int(stats.info("stats")["total_error_replies"])
            for _ in range(3):  # a pool each, as each process has its own: every connection is a new one
                pool = BlockingConnectionPool(**options)
                client = Redis(connection_pool=pool)
                await client.ping()
                await client.aclose()
                await pool.disconnect()
            counts.append(int(stats.info("stats")["total_error_replies"]) - before)
        assert counts[1] - counts[0] == 3, counts
    finally:
        stats.close()


@needs_redis
async def test_the_channel_layer_and_the_console_bridge_use_cancellable_connections():
    host = dict(settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0])
    layer_pool = create_pool(host)
    assert layer_pool.connection_class is CancellableConnection
    assert layer_pool.connection_kwargs["socket_timeout"] == 30  # the layer's own, past its 5 s blocking pops
    assert shared_redis().connection_pool.connection_class is CancellableConnection
