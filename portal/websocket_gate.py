"""What every WebSocket passes before it reaches a consumer: the Origin check, and the refusal of any path the
portal does not serve.

A refused socket is closed at the handshake (daphne answers 403) by a consumer without a channel layer. channels'
own refusal (``WebsocketDenier``) opened a channel-layer receive first, and its pending Redis read kept the refused
connection's application alive for 5-10 s after the refusal, holding a connection of the channel layer's
pool all the while: a page of another origin opening sockets in a loop could drain that pool. A path no route
matched raised ``URLRouter``'s "No route found", which daphne logged with a traceback for every such request.
"""

from __future__ import annotations

from urllib.parse import urlparse

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator, OriginValidator
from django.urls import re_path


class RefusedWebSocket(AsyncWebsocketConsumer):
    """Closes the handshake; nothing is ever sent to it, so it has no channel to wait on."""

    channel_layer_alias = None

    async def connect(self) -> None:
        await self.close()


class RefusingOriginValidator(OriginValidator):
    """channels' Origin check (the same rules: ``ALLOWED_HOSTS``; the last Origin header counts), refusing with
    ``RefusedWebSocket``, and refusing an Origin the URL parser rejects, which raised out of channels' check."""

    async def __call__(self, scope, receive, send):
        origins = [value for name, value in scope.get("headers", []) if name == b"origin"]
        try:
            valid = self.valid_origin(urlparse(origins[-1].decode("latin1")) if origins else None)
        except ValueError:  # not a URL the parser can take apart (a broken IPv6 host, say): refused, not a crash
            valid = False
        if valid:
            return await self.application(scope, receive, send)
        return await RefusedWebSocket()(scope, receive, send)


def websocket_gate(routes: list, *, middleware) -> RefusingOriginValidator:
    """``routes`` behind ``middleware`` (session and user) and the Origin check; any other path is refused."""
    allowed = AllowedHostsOriginValidator(None).allowed_origins  # ALLOWED_HOSTS, as channels reads it
    router = URLRouter([*routes, re_path(r"", RefusedWebSocket.as_asgi())])
    return RefusingOriginValidator(middleware(router), allowed)
