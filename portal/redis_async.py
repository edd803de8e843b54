"""Connection pools for redis-py's asyncio client that write under ``asyncio.timeout`` in the calling task rather
than ``wait_for``, which on Python 3.11 can lose the caller's cancellation (cpython#86296, ``portal.waiting``);
the time limit, disconnect on failure and errors are redis-py's own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis import exceptions
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.maint_notifications import MaintNotificationsConfig


class _WritesUnderTimeout(AbstractConnection):
    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        if not self.socket_timeout:  # redis-py writes in the calling task already
            await super().send_packed_command(command, check_health=check_health)
            return
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            async with asyncio.timeout(self.socket_timeout):
                await self._send_packed_command(command)
        except TimeoutError:  # the time limit (asyncio.timeout turns only its own expiry into TimeoutError)
            await self.disconnect(nowait=True)
            raise exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as error:
            await self.disconnect(nowait=True)
            err_no, message = error.args[:2] if len(error.args) >= 2 else ("UNKNOWN", error)
            raise exceptions.ConnectionError(f"Error {err_no} while writing to socket. {message}.") from error
        except BaseException:
            # Cancelled mid-write (or anything else): the command may be half sent, so the connection is not reused.
            await self.disconnect(nowait=True)
            raise


class CancellableConnection(_WritesUnderTimeout, Connection):
    """redis:// over TCP."""


class CancellableSSLConnection(_WritesUnderTimeout, SSLConnection):
    """rediss:// (TLS)."""


class CancellableUnixConnection(_WritesUnderTimeout, UnixDomainSocketConnection):
    """unix:// sockets."""


_CLASSES = {
    Connection: CancellableConnection,
    SSLConnection: CancellableSSLConnection,
    UnixDomainSocketConnection: CancellableUnixConnection,
}


# redis-py 8 asks each new RESP3 connection to send maintenance notifications (CLIENT MAINT_NOTIFICATIONS, a Redis
# Enterprise and Cloud command): Redis itself refuses it, so every connection a pool opened cost a round trip more and
# an error raised and caught. Switched off; a deployment on a server that sends them may pass its own config.
NO_MAINT_NOTIFICATIONS = MaintNotificationsConfig(enabled=False)


def pool_options(url: str, **options: Any) -> dict[str, Any]:
    """Keyword arguments for ``redis.asyncio.ConnectionPool`` (or its blocking kind) reaching ``url`` with ``options``
    and the cancellable connection class of the URL's scheme; channels_redis takes the same dict as a host."""
    parsed = parse_url(url)
    return {
        "maint_notifications_config": NO_MAINT_NOTIFICATIONS,
        **options,
        **parsed,
        "connection_class": _CLASSES[parsed.get("connection_class", Connection)],
    }
