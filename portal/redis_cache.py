"""django-redis's cache, with a ``clear()`` that deletes only this cache's keys (``<KEY_PREFIX>:<version>:<key>``)
instead of FLUSHDB: Celery's queues, channel-layer groups, console leases, metrics and other portals or test runs
sharing the Redis database under their own ``REDIS_KEY_PREFIX`` survive it."""

from __future__ import annotations

from django_redis.cache import RedisCache, omit_exception
from django_redis.client.default import glob_escape

# Keys deleted per DEL while clearing, and asked for per SCAN step.
CLEAR_BATCH = 1000


class PrefixedRedisCache(RedisCache):
    @omit_exception
    def clear(self) -> None:
        client = self.client.get_client(write=True)
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{glob_escape(self.key_prefix)}:*", count=CLEAR_BATCH):
            batch.append(key)
            if len(batch) == CLEAR_BATCH:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)
