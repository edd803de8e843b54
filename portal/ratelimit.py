"""Cache-backed fixed-window rate limits (``settings.RATE_LIMITS``), refused with a 429 ``ApplicationError`` and
Retry-After; and the sign-in throttle: past a few failures per (account, address) each try waits a doubling delay
(429 before any password check; the right password from elsewhere still works), each address has a limit too."""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.urls import reverse
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
    with contextlib.suppress(ValueError):  # the window ended and its counter expired: nothing to take back
        cache.decr(cache_key)


def rate_limit_exceeded(*, scope: str, key: str) -> int | None:
    """Seconds to wait if ``key`` has used up the ``scope`` limit (counting nothing), else None."""
    limit, _seconds, cache_key, retry_after = _window(scope, key)
    return retry_after if int(cache.get(cache_key, 0)) >= limit else None


ADDRESS_SCOPE = "login_address"
# The clock the delays are measured with (tests move it).
clock: Callable[[], float] = time.time


def client_address(request: HttpRequest) -> str:
    """REMOTE_ADDR, or the header the trusted proxy in front sets (settings)."""
    value = request.META.get(settings.RATE_LIMIT_CLIENT_ADDRESS_HEADER) or request.META.get("REMOTE_ADDR", "")
    # X-Forwarded-For style lists: the proxy appends the address it saw last.
    return value.split(",")[-1].strip() or "unknown"


def _pair_keys(*, request: HttpRequest, username: str) -> tuple[str, str]:
    # Hashed so that usernames and addresses never become cache key syntax.
    pair = f"{username.strip().lower()}\n{client_address(request)}"
    digest = hashlib.sha256(pair.encode()).hexdigest()[:32]
    return f"login_failures:{digest}:count", f"login_failures:{digest}:last"


def login_delay(failures: int) -> int:
    """Seconds to wait after the ``failures``-th failure for one account from one address (0: none)."""
    over = failures - settings.LOGIN_FAILURES_BEFORE_DELAY
    if over < 0:
        return 0
    return min(settings.LOGIN_DELAY_MAX_SECONDS, settings.LOGIN_DELAY_SECONDS * 2 ** min(over, 32))


def login_retry_after(*, request: HttpRequest, username: str | None) -> int | None:
    """Seconds to wait before this address may try this account (or any account) again, else None."""
    waits = [rate_limit_exceeded(scope=ADDRESS_SCOPE, key=client_address(request))]
    if username:
        count_key, last_key = _pair_keys(request=request, username=username)
        failures, last = int(cache.get(count_key, 0)), cache.get(last_key)
        if failures and last is not None and (left := last + login_delay(failures) - clock()) > 0:
            waits.append(math.ceil(left))
    return max((wait for wait in waits if wait is not None), default=None)


@receiver(user_login_failed, dispatch_uid="portal.login_throttle.failed")
def _on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    """Count a failed sign-in against the (account, address) and against the address."""
    if request is None:
        return
    _limit, seconds, cache_key, _retry_after = _window(ADDRESS_SCOPE, client_address(request))
    cache_count(cache_key, timeout=seconds + 1)
    if username := credentials.get("username"):
        count_key, last_key = _pair_keys(request=request, username=username)
        # Remembered after the last failure at least as long as the longest delay.
        memory = max(settings.LOGIN_DELAY_MAX_SECONDS, settings.RATE_LIMITS[ADDRESS_SCOPE][1])
        cache_count(count_key, timeout=memory)
        cache.touch(count_key, timeout=memory)
        cache.set(last_key, clock(), timeout=memory)


def login_failures_forget(*, request: HttpRequest, username: str) -> None:
    """A successful sign-in: that account's failures from that address no longer count."""
    cache.delete_many(list(_pair_keys(request=request, username=username)))


@receiver(user_logged_in, dispatch_uid="portal.login_throttle.logged_in")
def _on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is not None:
        login_failures_forget(request=request, username=user.get_username())


def throttled_message(retry_after: int) -> str:
    return _("Too many failed sign-in attempts. Wait %(seconds)s seconds before trying again.") % {
        "seconds": retry_after
    }


class LoginThrottleMiddleware:
    """Refuses POSTs to the portal's and the admin's sign-in pages while the account or address is held back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path in (resolve_url(settings.LOGIN_URL), reverse("admin:login")):
            retry_after = login_retry_after(request=request, username=request.POST.get("username"))
            if retry_after is not None:
                response = render(
                    request,
                    "portal/login_throttled.html",
                    {"retry_after": retry_after, "message": throttled_message(retry_after)},
                    status=429,
                )
                response["Retry-After"] = str(retry_after)
                return response
        return self.get_response(request)
