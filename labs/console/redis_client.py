"""One asyncio Redis client per event loop for the bridge's lease and scrollback (None without REDIS_URL)."""

from __future__ import annotations

import asyncio
import weakref

import redis.asyncio as redis_asyncio
from django.conf import settings

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis_asyncio.Redis] = weakref.WeakKeyDictionary()


def shared_redis() -> redis_asyncio.Redis | None:
    """The client for the running loop; the connection pool is shared by every console in this process.

    Clients are per loop because a connection belongs to the loop that opened it (tests run one loop each).
    """
    if not settings.REDIS_URL:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = redis_asyncio.Redis.from_url(settings.REDIS_URL, health_check_interval=30)
        _clients[loop] = client
    return client
