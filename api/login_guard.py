"""Throttling of password guessing, for the HTML login form and the API's token endpoint alike.

Failed logins are counted per username and per client address (``user_login_failed``, which Django sends for
every failed ``authenticate()`` with the request). Once either count reaches its limit, further login attempts
are refused with 429 and ``Retry-After`` before any password is checked, so the limit also stops the correct
password from being tried. A successful login clears that username's count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _

from portal.ratelimit import rate_limit_count, rate_limit_exceeded, rate_limit_reset

USERNAME_SCOPE = "login_username"
ADDRESS_SCOPE = "login_address"


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or the header the trusted proxy in front sets (settings)."""
    header = settings.RATE_LIMIT_CLIENT_ADDRESS_HEADER or "REMOTE_ADDR"
    value = request.META.get(header, "") or request.META.get("REMOTE_ADDR", "")
    # X-Forwarded-For style lists: the proxy appends the address it saw last.
    return value.split(",")[-1].strip() or "unknown"


def _username_key(username: str) -> str:
    return username.strip().lower()


def login_retry_after(*, request: HttpRequest, username: str | None) -> int | None:
    """Seconds to wait before another login attempt from this address or for this username, else None."""
    waits = [rate_limit_exceeded(scope=ADDRESS_SCOPE, key=client_address(request))]
    if username:
        waits.append(rate_limit_exceeded(scope=USERNAME_SCOPE, key=_username_key(username)))
    waits = [wait for wait in waits if wait is not None]
    return max(waits) if waits else None


def record_login_failure(*, request: HttpRequest | None, username: str | None) -> None:
    if username:
        rate_limit_count(scope=USERNAME_SCOPE, key=_username_key(username))
    if request is not None:
        rate_limit_count(scope=ADDRESS_SCOPE, key=client_address(request))


def _on_login_failed(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None,
                     **kwargs: Any) -> None:
    record_login_failure(request=request, username=credentials.get("username"))


def _on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    rate_limit_reset(scope=USERNAME_SCOPE, key=_username_key(user.get_username()))


def connect_signals() -> None:
    user_login_failed.connect(_on_login_failed, dispatch_uid="api.login_guard.failed")
    user_logged_in.connect(_on_logged_in, dispatch_uid="api.login_guard.logged_in")


def throttled_message(retry_after: int) -> str:
    return _(
        "Too many failed sign-in attempts. Wait %(seconds)s seconds before trying again."
    ) % {"seconds": retry_after}


class LoginThrottleMiddleware:
    """Refuses POSTs to the sign-in pages (the portal's and the admin's) while the username or the address is
    over its failure limit."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self._login_paths: set[str] | None = None

    def login_paths(self) -> set[str]:
        if self._login_paths is None:
            paths = set()
            for name in (settings.LOGIN_URL, "admin:login"):
                try:
                    paths.add(reverse(name))
                except NoReverseMatch:
                    if str(name).startswith("/"):
                        paths.add(str(name))
            self._login_paths = paths
        return self._login_paths

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path in self.login_paths():
            retry_after = login_retry_after(request=request, username=request.POST.get("username"))
            if retry_after is not None:
                response = render(
                    request, "api/login_throttled.html",
                    {"retry_after": retry_after, "message": throttled_message(retry_after)}, status=429,
                )
                response["Retry-After"] = str(retry_after)
                return response
        return self.get_response(request)
