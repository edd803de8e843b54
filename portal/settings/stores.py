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
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # Server-side binding gives the same query text every time, which psycopg prepares after
        # DB_PREPARE_THRESHOLD runs on a connection that lives (set it to 0 behind PgBouncer in transaction mode).
        prepare_threshold = env_int("DB_PREPARE_THRESHOLD", 5)
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True,
            prepare_threshold=prepare_threshold if prepare_threshold > 0 else None,
        )
    # daphne gives each request its own thread and connection: a pool per process makes a class's Starts wait
    # rather than exhaust PostgreSQL's max_connections (needs DB_CONN_MAX_AGE=0).
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
            # WAL: readers and the web's, worker's and beat's writers no longer hold each other up.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"},
            # A file, not the in-memory database, whose shared cache fails at once on another thread's write lock.
            "TEST": {"NAME": str(VAR_DIR / "test_portal.sqlite3")},
        }
    }

# Redis: Celery broker and the channel layer in production and tests; in-memory in the embedded default.
REDIS_URL = env_str("REDIS_URL")
# Without driver information redis-py skips CLIENT SETINFO (two round trips and a metadata read) on each new connection.
REDIS_CONNECTION_OPTIONS = {"driver_info": None}
# Every Redis key of the portal begins with this, so that several portals or test runs can share one database.
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's, with a receive that loses no message when its consumer leaves (portal.channel_layer).
            "BACKEND": "portal.channel_layer.RedisChannelLayer",
            # socket_timeout above channels_redis's 5 s BZPOPMIN (redis-py's 5 s default killed idle consumers); a
            # bounded pool makes a class's hundred group_add calls wait for a connection (portal.redis_async).
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
    # Channels' own, forgetting the channels of consumers that ended (portal.memory_channel_layer), with room for
    # as many messages per channel as above (a class's tabs overflowed the default of 100).
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "portal.memory_channel_layer.InMemoryChannelLayer", "CONFIG": {"capacity": 1500}}
    }
    CELERY_BROKER_URL = "memory://localhost/"  # with a host: kombu warns at start without one
# Shared by web, worker and beat through Redis (process memory in the embedded default). django-redis keeps one
# connection pool per process; Django's own backend built one per request under ASGI.
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
