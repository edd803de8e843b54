"""The portal's Redis connections: one pool per process for the cache, and no client-library handshake on each
new connection, whichever pool opens it."""

import contextvars

import pytest
from channels_redis.utils import create_pool
from django.conf import settings
from django.core.cache import caches

from labs.console.state import shared_redis

# bin/test (and so CI) always sets REDIS_URL; only a run without Redis, which caches in process memory and has no
# Redis pools at all, skips these.
pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="no REDIS_URL: nothing here uses Redis")


def test_each_request_context_shares_the_process_connection_pool():
    # Under ASGI each request runs in its own context and so gets its own cache object (Django's connection
    # handler is context-local); the Redis connections behind them must still be the process's one pool.
    def pool_of_a_new_context():
        cache = caches["default"]
        cache.set("cache-test-probe", 1, timeout=5)
        return cache, cache.client.get_client(write=True).connection_pool

    first_cache, first_pool = contextvars.Context().run(pool_of_a_new_context)
    second_cache, second_pool = contextvars.Context().run(pool_of_a_new_context)
    assert first_cache is not second_cache
    assert first_pool is second_pool
    assert second_cache.get("cache-test-probe") == 1


async def test_new_connections_of_every_pool_skip_the_client_library_handshake():
    # With a library name and version, redis-py sends CLIENT SETINFO on each new connection and reads its own
    # package metadata from disk to fill them in, again for every connection.
    pools = {
        "cache": caches["default"].client.get_client(write=True).connection_pool,
        "channel layer": create_pool(dict(settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0])),
        "console": shared_redis().connection_pool,
    }
    for name, pool in pools.items():
        assert pool.make_connection().driver_info is None, name
