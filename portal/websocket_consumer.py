"""What the portal's WebSocket consumers share: a send to a browser that has just closed is dropped rather than
killing the consumer before its ``disconnect()`` (channels#1466), messages are dispatched without channels'
per-message thread hop, and a page's listening socket joins its group before its first message."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from autobahn.exception import Disconnected
from channels.consumer import AsyncConsumer, get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.errors import ApplicationError

logger = logging.getLogger(__name__)

# daphne's refusal, and what the ASGI spec asks other servers to raise for a send on a closed connection.
CLOSED_SOCKET_ERRORS = (Disconnected, OSError)
# Close codes the page understands (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class NotAuthenticated(Exception):
    """The handshake carries no logged-in session."""


class PortalConsumer(AsyncConsumer):
    """Put last among a WebSocket consumer's bases (``class C(AsyncWebsocketConsumer, PortalConsumer)``), so that
    it comes right before ``AsyncConsumer``: every message the consumer sends and is given passes through it."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The embedded default's in-memory layer would otherwise keep what is sent to the gone consumer.
            layer = getattr(self, "channel_layer", None)
            if layer is not None and "discard_channel" in layer.extensions and hasattr(self, "channel_name"):
                await layer.discard_channel(self.channel_name)

    async def send(self, message: dict) -> None:
        try:
            await super().send(message)
        except CLOSED_SOCKET_ERRORS as exc:
            logger.debug(
                "%s: dropped %s for a socket that is closing (%s)", type(self).__name__, message.get("type"), exc
            )

    async def dispatch(self, message: dict) -> None:
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
        """Close for no session (4401) or nothing this user may see (4404)."""
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
