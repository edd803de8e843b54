"""Cache-backed fixed-window rate limits (``settings.RATE_LIMITS``: scope to limit and window), shared by every web
process through the cache. A refusal is a 429 ``ApplicationError`` whose ``retry_after`` becomes ``Retry-After``."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.utils.translation import gettext as _

from portal.errors import ApplicationError


class RateLimited(ApplicationError):
    status_code = 429
    code = "rate_limited"


@dataclass(frozen=True)
class Window:
    limit: int
    seconds: int
    count: int
    retry_after: int
    cache_key: str

    @property
    def exceeded(self) -> bool:
        return self.count > self.limit


def _rate(scope: str) -> tuple[int, int]:
    try:
        limit, seconds = settings.RATE_LIMITS[scope]
    except KeyError:
        raise KeyError(f"No rate limit named {scope!r} in settings.RATE_LIMITS.") from None
    return int(limit), int(seconds)


def _cache_key(scope: str, key: str, bucket: int) -> str:
    # Hashed so that usernames and addresses never become cache key syntax.
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"ratelimit:{scope}:{digest}:{bucket}"


@dataclass(frozen=True)
class Counted:
    """One request counted by ``rate_limit_hit``: the window it went into, for ``rate_limit_refund``."""

    cache_key: str


def _window(scope: str, key: str, *, increment: bool) -> Window:
    limit, seconds = _rate(scope)
    now = time.time()
    bucket = int(now // seconds)
    cache_key = _cache_key(scope, key, bucket)
    if increment:
        cache.add(cache_key, 0, timeout=seconds + 1)
        try:
            count = cache.incr(cache_key)
        except ValueError:  # expired between add and incr
            cache.set(cache_key, 1, timeout=seconds + 1)
            count = 1
    else:
        count = int(cache.get(cache_key, 0))
    retry_after = max(1, math.ceil((bucket + 1) * seconds - now))
    return Window(limit=limit, seconds=seconds, count=count, retry_after=retry_after, cache_key=cache_key)


def rate_limit_hit(*, scope: str, key: str, message: str | None = None) -> Counted:
    """Count one request of ``key`` against the ``scope`` limit; raise ``RateLimited`` once it is exceeded."""
    window = _window(scope, key, increment=True)
    if window.exceeded:
        raise RateLimited(
            message or _("Too many requests. Try again in %(seconds)s seconds.") % {"seconds": window.retry_after},
            retry_after=window.retry_after,
        )
    return Counted(cache_key=window.cache_key)


def rate_limit_refund(counted: Counted) -> None:
    """Take back a request that ``rate_limit_hit`` counted (it turned out to do nothing the limit is for). The
    count goes back in the window it went into; if that window has ended, there is nothing to take back."""
    try:
        cache.decr(counted.cache_key)
    except ValueError:  # the window ended and its counter expired
        pass


def rate_limit_count(*, scope: str, key: str) -> None:
    """Count one event (a failed login) without refusing anything."""
    _window(scope, key, increment=True)


def rate_limit_exceeded(*, scope: str, key: str) -> int | None:
    """Seconds to wait if ``key`` has used up the ``scope`` limit (counting nothing), else None."""
    limit, _seconds = _rate(scope)
    window = _window(scope, key, increment=False)
    return window.retry_after if window.count >= limit else None
