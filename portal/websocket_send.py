"""Sending to a browser that has just closed its socket.

Between a browser's close frame and the end of its connection, daphne (autobahn underneath) refuses every send
with ``autobahn.exception.Disconnected``. A push that lands in that window (an attempt update, a grading result,
console output) raised out of the consumer: channels logged it as "Exception inside application" and dropped the
consumer without running its ``disconnect()``, so its group memberships, console viewer registration and lease
stayed behind until they expired. The message was for a page that is gone: it is dropped, and the
``websocket.disconnect`` that daphne delivers next ends the consumer the usual way (channels/channels#1466).
"""

from __future__ import annotations

import logging

from autobahn.exception import Disconnected
from channels.consumer import AsyncConsumer

logger = logging.getLogger(__name__)

# daphne's refusal, and what the ASGI spec asks other servers to raise for a send on a closed connection.
CLOSED_SOCKET_ERRORS = (Disconnected, OSError)


class ClosedSocketTolerant(AsyncConsumer):
    """Put last among a WebSocket consumer's bases (``class C(AsyncWebsocketConsumer, ClosedSocketTolerant)``), so
    that it comes right before ``AsyncConsumer`` and every message the consumer sends (text, bytes, JSON, close)
    passes through it: what the closing socket refuses is dropped."""

    async def send(self, message: dict) -> None:
        try:
            await super().send(message)
        except CLOSED_SOCKET_ERRORS as exc:
            logger.debug("%s: dropped %s for a socket that is closing (%s)", type(self).__name__,
                         message.get("type"), exc)
