"""Cache-backed fixed-window rate limits (``settings.RATE_LIMITS``: scope to limit and window), shared by every web
process through the cache. A refusal is a 429 ``ApplicationError`` whose ``retry_after`` becomes ``Retry-After``."""

from __future__ import annotations

import hashlib
import math
import time

from django.conf import settings
from django.core.cache import cache
from django.utils.translation import gettext as _

from portal.errors import ApplicationError


class RateLimited(ApplicationError):
    status_code = 429
    code = "rate_limited"


def cache_count(cache_key: str, *, timeout: int) -> int:
    """Add one to a counter in the cache, which forgets it ``timeout`` seconds after it was created."""
    cache.add(cache_key, 0, timeout=timeout)
    try:
        return cache.incr(cache_key)
    except ValueError:  # expired between add and incr
        cache.set(cache_key, 1, timeout=timeout)
        return 1


def _window(scope: str, key: str) -> tuple[int, int, str, int]:
    """The scope's limit and window, and the current window's cache key and seconds left."""
    limit, seconds = settings.RATE_LIMITS[scope]
    now = time.time()
    bucket = int(now // seconds)
    # Hashed so that usernames and addresses never become cache key syntax.
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return limit, seconds, f"ratelimit:{scope}:{digest}:{bucket}", max(1, math.ceil((bucket + 1) * seconds - now))


def rate_limit_hit(*, scope: str, key: str, message: str | None = None) -> str:
    """Count one request against the ``scope`` limit, raising ``RateLimited`` past it; returns the key to refund."""
    limit, seconds, cache_key, retry_after = _window(scope, key)
    if cache_count(cache_key, timeout=seconds + 1) > limit:
        raise RateLimited(
            message or _("Too many requests. Try again in %(seconds)s seconds.") % {"seconds": retry_after},
            retry_after=retry_after,
        )
    return cache_key


def rate_limit_refund(cache_key: str) -> None:
    """Take back a request that ``rate_limit_hit`` counted (it turned out to do nothing the limit is for)."""
    try:
        cache.decr(cache_key)
    except ValueError:  # the window ended and its counter expired: nothing to take back
        pass


def rate_limit_count(*, scope: str, key: str) -> None:
    """Count one event (a failed login) without refusing anything."""
    _limit, seconds, cache_key, _retry_after = _window(scope, key)
    cache_count(cache_key, timeout=seconds + 1)


def rate_limit_exceeded(*, scope: str, key: str) -> int | None:
    """Seconds to wait if ``key`` has used up the ``scope`` limit (counting nothing), else None."""
    limit, _seconds, cache_key, retry_after = _window(scope, key)
    return retry_after if int(cache.get(cache_key, 0)) >= limit else None
