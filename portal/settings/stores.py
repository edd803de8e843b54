"""Where the portal keeps its state: the database, and Redis for the cache, sessions, channel layer and Celery's
broker (all in-process in the embedded default)."""

from __future__ import annotations

import dj_database_url

from portal.redis_async import pool_options
from portal.settings.base import VAR_DIR
from portal.settings.env import env_int, env_str

# Database: PostgreSQL through DATABASE_URL, otherwise SQLite under var/.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
    # daphne runs each request and WebSocket handshake in its own thread, each with its own connection: a class
    # pressing Start at once would open one per student and exhaust PostgreSQL's max_connections. A pool of
    # DB_POOL_MAX_SIZE connections per process makes the excess wait instead (needs DB_CONN_MAX_AGE=0).
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # Parameters bound by the server rather than spliced into the SQL: the same query text every time, which
        # psycopg prepares once a connection has run it DB_PREPARE_THRESHOLD times, so PostgreSQL stops planning
        # it anew (most of its CPU for the portal's small lookups). Pays off on connections that live: pooled or
        # DB_CONN_MAX_AGE. Django switches preparing off by default for PgBouncer in transaction mode: set
        # DB_PREPARE_THRESHOLD=0 behind such a pooler.
        prepare_threshold = env_int("DB_PREPARE_THRESHOLD", 5)
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True,
            prepare_threshold=prepare_threshold if prepare_threshold > 0 else None,
        )
    if env_int("DB_POOL_MAX_SIZE", 0) > 0 and DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": env_int("DB_POOL_MAX_SIZE", 0),
            "timeout": env_int("DB_POOL_TIMEOUT", 30),
        }
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # a fresh clone has no var/ yet, and SQLite will not create it
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "portal.sqlite3"),
            # WAL: a read under way (a report streaming its rows, a page's queries) no longer holds up the commits
            # of the web's, worker's and beat's writers, nor they the readers; the mode stays with the file.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"},
            # Tests get a file of their own, not Django's default in-memory database: that one is opened with a
            # shared cache, where a thread's connection meeting another's uncommitted write fails at once ("database
            # table is locked") instead of waiting out the timeout as the portal's connections to its file do.
            "TEST": {"NAME": str(VAR_DIR / "test_portal.sqlite3")},
        }
    }

# Redis: Celery broker and the channel layer in production and tests; in-memory in the embedded default.
REDIS_URL = env_str("REDIS_URL")
# Options for every Redis connection pool of ours. Without driver information, redis-py neither sends CLIENT
# SETINFO on each new connection (two more round trips) nor reads its own package metadata from disk for it, which
# it does again for every connection: a class's sockets opening together grow the pools by a hundred.
REDIS_CONNECTION_OPTIONS = {"driver_info": None}
# Every Redis key of the portal (cache and sessions, channel layer, Celery's queues, console and metrics keys)
# begins with this, so that several portals, or test runs (tests/run_isolation.py), can share one database.
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's, with a receive that loses no message when its consumer leaves (portal.channel_layer).
            "BACKEND": "portal.channel_layer.RedisChannelLayer",
            # channels_redis waits for messages with a 5 s BZPOPMIN; redis-py 8 gives sockets a 5 s read timeout
            # by default, which fires first and kills every consumer that has been idle for 5 s.
            # Its pool holds at most CHANNEL_LAYER_MAX_CONNECTIONS per process and makes a command wait for a
            # free one past that (portal.channel_layer): a class opening its sockets together runs a hundred
            # group_add calls at once, which would otherwise open a hundred connections (or fail past the size).
            # Its connections write under asyncio.timeout, so a consumer's cancelled receive really ends
            # (portal.redis_async).
            "CONFIG": {
                "hosts": [
                    pool_options(
                        REDIS_URL,
                        socket_timeout=30,
                        max_connections=env_int("CHANNEL_LAYER_MAX_CONNECTIONS", 32),
                        **REDIS_CONNECTION_OPTIONS,
                    )
                ],
                "capacity": 1500,
                "expiry": 30,
                "prefix": f"{REDIS_KEY_PREFIX}asgi",
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
else:
    # Channels' own, forgetting the channels of consumers that ended (portal.memory_channel_layer).
    # Room for as many messages per channel as channels_redis is given above: a class's tabs announcing themselves
    # to a console's holder at once overflowed channels' default of 100, and the overflow is dropped.
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "portal.memory_channel_layer.InMemoryChannelLayer", "CONFIG": {"capacity": 1500}}
    }
    CELERY_BROKER_URL = "memory://localhost/"  # with a host: kombu warns at start without one
# The cache is shared by web, worker and beat through Redis (the sync loop's heartbeat read by /readyz, probe
# results); the embedded default runs everything in one process, so process memory is enough there.
# django-redis keeps one connection pool per process: Django's own Redis backend builds a pool per cache object,
# and under ASGI every request has its own, so each request (and each socket handshake reading its session) paid
# for a new Redis connection.
if REDIS_URL:
    CACHES = {
        "default": {
            # django-redis's, whose clear() removes only this cache's keys, not the whole database (portal.redis_cache).
            "BACKEND": "portal.redis_cache.PrefixedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_KEY_PREFIX,
            "OPTIONS": {
                "SOCKET_CONNECT_TIMEOUT": 5,
                "SOCKET_TIMEOUT": 5,
                "CONNECTION_POOL_KWARGS": REDIS_CONNECTION_OPTIONS,
            },
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "portal"}}
# True when tasks are consumed by a worker running inside the web process (the embedded default).
CELERY_EMBEDDED_WORKER = REDIS_URL is None
