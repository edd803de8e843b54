"""What every WebSocket passes before a consumer: an Origin compared as Django's CSRF check compares it (the Host's
own, or ``CSRF_TRUSTED_ORIGINS``), and a refusal for any path the portal does not serve, closed at the handshake
by a consumer without a channel layer."""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.urls import re_path
from django.utils.http import is_same_domain


class RefusedWebSocket(AsyncWebsocketConsumer):
    """Closes the handshake; nothing is ever sent to it, so it has no channel to wait on."""

    channel_layer_alias = None  # type: ignore[assignment]  # Channels reads None as "no channel layer"

    async def connect(self) -> None:
        await self.close()


def _last_header(scope, name: bytes) -> str | None:
    values = [value for key, value in scope.get("headers", []) if key == name]
    return values[-1].decode("latin1") if values else None


def _is_secure(scope) -> bool:
    """As ``HttpRequest.is_secure``: the proxy's header when ``SECURE_PROXY_SSL_HEADER`` names one and it is
    present, else the socket's own scheme."""
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        header = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        value = _last_header(scope, header)
        if value is not None:
            return value.split(",")[0].strip() == secure_value
    return scope.get("scheme") in ("wss", "https")


def origin_allowed(scope) -> bool:
    """Is the socket's Origin the page's own (or a trusted one), as ``CsrfViewMiddleware`` decides for a POST?"""
    origin, host = _last_header(scope, b"origin"), _last_header(scope, b"host")
    if not origin or not host:
        return False
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    if origin == f"{'https' if _is_secure(scope) else 'http'}://{host}":
        return True
    trusted = settings.CSRF_TRUSTED_ORIGINS
    if origin in [candidate for candidate in trusted if "*" not in candidate]:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:  # not a URL the parser can take apart (a broken IPv6 host, say): refused, not a crash
        return False
    return any(
        is_same_domain(parsed.netloc, urlsplit(candidate).netloc.lstrip("*"))
        for candidate in trusted
        if "*" in candidate and urlsplit(candidate).scheme == parsed.scheme
    )


class SameOriginGate:
    """Passes a socket whose Origin is allowed on to ``application``; refuses any other with ``RefusedWebSocket``."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await RefusedWebSocket()(scope, receive, send)


def websocket_gate(routes: list, *, middleware) -> SameOriginGate:
    """``routes`` behind ``middleware`` (session and user) and the Origin check; any other path is refused."""
    # Channels routes Django's path()/re_path() to ASGI applications; the stubs type their target as a view.
    router = URLRouter([*routes, re_path(r"", RefusedWebSocket.as_asgi())])  # type: ignore[arg-type,list-item]
    return SameOriginGate(middleware(router))
