"""One asyncio Redis client per event loop for the bridge's lease and scrollback (None without REDIS_URL)."""

from __future__ import annotations

import asyncio
import weakref

import redis.asyncio as redis_asyncio
from django.conf import settings

from portal.redis_async import pool_options

# Past CONSOLE_REDIS_MAX_CONNECTIONS a command waits for a free connection (up to the timeout) instead of failing,
# which redis-py's default pool does at once from its 101st simultaneous command.
CONNECTION_WAIT_SECONDS = 10.0

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis_asyncio.Redis] = weakref.WeakKeyDictionary()


def console_key(kind: str, attempt_id: int) -> str:
    """The Redis key of one attempt's console ``kind`` (lease, viewers, scrollback, offset)."""
    return f"{settings.REDIS_KEY_PREFIX}portal:console:{kind}:{attempt_id}"


def shared_redis() -> redis_asyncio.Redis | None:
    """The client for the running loop; the connection pool is shared by every console in this process.

    Clients are per loop because a connection belongs to the loop that opened it (tests run one loop each).
    """
    if not settings.REDIS_URL:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        # Cancellable connections (portal.redis_async): a console's tasks are cancelled mid-command when its tab
        # closes.
        pool = redis_asyncio.BlockingConnectionPool(
            **pool_options(
                settings.REDIS_URL,
                health_check_interval=30,
                timeout=CONNECTION_WAIT_SECONDS,
                max_connections=settings.CONSOLE_REDIS_MAX_CONNECTIONS,
                **settings.REDIS_CONNECTION_OPTIONS,
            )
        )
        client = redis_asyncio.Redis(connection_pool=pool)
        _clients[loop] = client
    return client
