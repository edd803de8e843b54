"""django-redis's cache, with a ``clear()`` that deletes only this cache's keys (``<KEY_PREFIX>:<version>:<key>``)
instead of FLUSHDB: Celery's queues, channel-layer groups, console leases, metrics and other portals or test runs
sharing the Redis database under their own ``REDIS_KEY_PREFIX`` survive it."""

from __future__ import annotations

from django_redis.cache import RedisCache, omit_exception
from django_redis.client.default import glob_escape
from django_redis.util import CacheKey


class PrefixedRedisCache(RedisCache):
    @omit_exception
    def clear(self) -> None:
        # A CacheKey is taken as the whole pattern: every version of this cache's keys.
        self.delete_pattern(CacheKey(f"{glob_escape(self.key_prefix)}:*"), itersize=1000)
