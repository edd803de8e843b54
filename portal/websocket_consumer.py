"""What the portal's WebSocket consumers share: a send to a browser that has just closed is dropped rather than
killing the consumer before its ``disconnect()`` (channels#1466), and messages are dispatched without channels'
per-message thread hop (the consumers close their database connections through ``database_sync_to_async``)."""

from __future__ import annotations

import logging

from autobahn.exception import Disconnected
from channels.consumer import AsyncConsumer, get_handler_name

logger = logging.getLogger(__name__)

# daphne's refusal, and what the ASGI spec asks other servers to raise for a send on a closed connection.
CLOSED_SOCKET_ERRORS = (Disconnected, OSError)


class PortalConsumer(AsyncConsumer):
    """Put last among a WebSocket consumer's bases (``class C(AsyncWebsocketConsumer, PortalConsumer)``), so that
    it comes right before ``AsyncConsumer``: every message the consumer sends (text, bytes, JSON, close) and every
    message it is given passes through it."""

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
