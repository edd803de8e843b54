"""django-redis's cache, with a ``clear()`` that removes this cache's keys only.

django-redis clears a cache with FLUSHDB: every key of the Redis database goes, not only the cache's. The portal
keeps its Celery queues, channel-layer groups, console leases and metrics in the same database, and several portals
(or test processes, ``tests/run_isolation.py``) share one under their ``REDIS_KEY_PREFIX``: a ``cache.clear()``
anywhere emptied every one of them, and the pages open at that moment lost their live updates (their groups were
gone). Here ``clear()`` deletes the keys the cache's own key function makes, ``<KEY_PREFIX>:<version>:<key>``, of
every version, and nothing else.
"""

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
