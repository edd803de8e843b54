"""What every WebSocket passes: the Origin check, lazy session authentication and the page's language; and the base
of the portal's consumers (a send to a closed socket is dropped, groups joined before the first message, signing
out closes the session's sockets)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import async_to_sync
from autobahn.exception import Disconnected
from channels.consumer import AsyncConsumer, get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from channels.middleware import BaseMiddleware
from channels.routing import URLRouter
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host
from django.urls import re_path
from django.utils import translation
from django.utils.functional import SimpleLazyObject
from django.utils.http import is_same_domain

from portal.errors import ApplicationError

logger = logging.getLogger(__name__)

# daphne's refusal, and what the ASGI spec asks other servers to raise for a send on a closed connection.
CLOSED_SOCKET_ERRORS = (Disconnected, OSError)
# Close codes the page understands (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


def session_user(scope: dict[str, Any]):
    """The scope's user from its session (all ``get_user`` reads), or ``AnonymousUser``. Sync code only."""
    return get_user(SimpleNamespace(session=scope["session"]))  # type: ignore[arg-type]


class LazySessionAuthMiddleware(BaseMiddleware):
    """A lazy ``scope["user"]``, resolved (as ``get_user`` does) inside the consumer's one ``thread_sensitive=False``
    database call, so handshakes do not queue on the thread for sync code; async code must not touch it."""

    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        if "user" not in scope:
            scope["user"] = SimpleLazyObject(lambda: session_user(scope))
        return await super().__call__(scope, receive, send)


def scope_language(scope: Mapping[str, Any]) -> str:
    """The language code for this connection: the language cookie, then ``Accept-Language``, then the default."""
    headers = dict(scope.get("headers") or ())
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    request = SimpleNamespace(COOKIES=scope.get("cookies") or {}, META={"HTTP_ACCEPT_LANGUAGE": accept})
    # It reads only COOKIES and META, and falls back to the default language on anything malformed.
    return translation.get_language_from_request(request, check_path=False)  # type: ignore[arg-type]


async def refuse_websocket(scope, receive, send) -> None:
    """Closes the handshake: an ASGI application with no channel, thread or database connection to set up."""
    if (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close"})


def _last_header(scope, name: bytes) -> str | None:
    values = [value for key, value in scope.get("headers", []) if key == name]
    return values[-1].decode("latin1") if values else None


def _is_secure(scope) -> bool:
    """As ``HttpRequest.is_secure``: the ``SECURE_PROXY_SSL_HEADER`` if the proxy sent it, else the socket's scheme."""
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


def websocket_gate(routes: list):
    """``routes`` behind session authentication and the Origin check; any other path or Origin is refused."""
    # Channels routes Django's path()/re_path() to ASGI applications; the stubs type their target as a view.
    router = URLRouter([*routes, re_path(r"", refuse_websocket)])  # type: ignore[arg-type,list-item]
    application = CookieMiddleware(SessionMiddleware(LazySessionAuthMiddleware(router)))

    async def gate(scope, receive, send):
        if origin_allowed(scope):
            return await application(scope, receive, send)
        return await refuse_websocket(scope, receive, send)

    return gate


def session_group(session_key: str) -> str:
    """The group of the sockets a session opened (hashed: a session key is a credential)."""
    return "session-" + hashlib.sha256(session_key.encode()).hexdigest()[:32]


@receiver(user_logged_out, dispatch_uid="portal.websockets.signed_out")
def _close_sockets_of_session(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """Signing out closes the session's sockets: a console left open on a shared computer takes no more input."""
    key = request.session.session_key if request is not None else None
    layer = get_channel_layer()
    if key and layer is not None:
        try:
            async_to_sync(layer.group_send)(session_group(key), {"type": "session.ended"})
        except Exception:
            logger.warning("could not close the sockets of a session that signed out", exc_info=True)


class NotAuthenticated(Exception):
    """The handshake carries no logged-in session."""


class PortalConsumer(AsyncConsumer):
    """Put last among a WebSocket consumer's bases (``class C(AsyncWebsocketConsumer, PortalConsumer)``), so that
    it comes right before ``AsyncConsumer``: every message the consumer sends and is given passes through it."""

    session_group: str | None = None
    signed_out = False

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            layer = getattr(self, "channel_layer", None)
            if layer is not None and self.session_group is not None:
                try:
                    await layer.group_discard(self.session_group, self.channel_name)
                except Exception:  # the group expires by itself
                    logger.warning("could not leave %s", self.session_group, exc_info=True)
            # The embedded default's in-memory layer would otherwise keep what is sent to the gone consumer.
            if layer is not None and "discard_channel" in layer.extensions and hasattr(self, "channel_name"):
                await layer.discard_channel(self.channel_name)

    async def join_session(self) -> None:
        """Join the handshake's session's group, before access is decided: signing out closes this socket."""
        session = self.scope.get("session")
        if session is not None and session.session_key:
            self.session_group = session_group(session.session_key)
            await self.channel_layer.group_add(self.session_group, self.channel_name)

    async def session_ended(self, message: dict) -> None:
        self.signed_out = True
        # This class's send (one ASGI message): the WebSocket consumers' own send takes a frame's text.
        await PortalConsumer.send(self, {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED})

    async def send(self, message: dict) -> None:
        try:
            await super().send(message)
        except CLOSED_SOCKET_ERRORS as exc:
            logger.debug(
                "%s: dropped %s for a socket that is closing (%s)", type(self).__name__, message.get("type"), exc
            )

    async def dispatch(self, message: dict) -> None:
        if self.signed_out and message["type"] == "websocket.receive":
            return  # sent before the browser had the close its session's sign-out sent
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            if message["type"].startswith("websocket."):
                raise ValueError(f"No handler for message type {message['type']}")
            return  # a group may carry message types this consumer has no use for
        await handler(message)


# PortalConsumer's send is AsyncConsumer's (one message), which the WebSocket send calls through the MRO.
class PageSocketConsumer(AsyncJsonWebsocketConsumer, PortalConsumer):  # type: ignore[misc]
    """A page's socket that only listens to the channel-layer ``group`` it joined."""

    group: str | None = None  # None until accepted

    async def join_and_accept(self, group: str, read: Callable[[], Awaitable[Any]]) -> Any:
        """Join ``group``, then ``read`` what the page is first sent, deciding access: a change committed in between
        is delivered after it, never lost. Refused (``NotAuthenticated``, ``ApplicationError``): closed, None."""
        await self.join_session()
        await self.channel_layer.group_add(group, self.channel_name)
        try:
            first = await read()
        except (NotAuthenticated, ApplicationError) as exc:
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.refuse(exc)
            return None
        self.group = group
        await self.accept()
        return first

    async def refuse(self, exc: Exception) -> None:
        await self.close(code=CLOSE_UNAUTHENTICATED if isinstance(exc, NotAuthenticated) else CLOSE_NOT_FOUND)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """A ping keeps proxies from closing an idle socket. Anything else (not JSON, a binary frame, another type)
        is answered with ``bad_message`` rather than left to end the consumer, which would skip its cleanup."""
        try:
            content = await self.decode_json(text_data) if text_data is not None else None
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser follows
            content = None
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "code": "bad_message"})
