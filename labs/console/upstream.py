"""The bridge's upstream: the VMI ``console`` subresource over WebSocket (``plain.kubevirt.io``, binary frames only),
retried every second until the VMI runs, like ``virtctl console``, and re-opened with capped backoff when lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import aiohttp
from django.conf import settings

from labs.kubevirt.client import stream_target, vmi_subresource_path
from portal.waiting import cancel_and_wait, wait_event

logger = logging.getLogger(__name__)

CONSOLE_SUBPROTOCOL = "plain.kubevirt.io"
# Frames queued between the socket reader and the fan-out; beyond it TCP pushes back on the API server.
READ_QUEUE_FRAMES = 64
# Output read in one go is fanned out as one chunk up to this size: fewer, larger messages under load.
BATCH_BYTES = 64 * 1024


class UpstreamState(StrEnum):
    CONNECTING = "connecting"
    WAITING = "waiting"  # VMI not running yet (400) or not there yet (404)
    CONNECTED = "connected"
    LOST = "lost"  # was connected, or the API failed: reconnecting
    FAILED = "failed"  # VMI in Failed phase (409)
    ENDED = "ended"  # the attempt is over; no VM to talk to


@dataclass(frozen=True)
class ConsoleLocation:
    """Where the attempt's VMI is, or why there is none to connect to."""

    namespace: str = ""
    name: str = ""
    ended: bool = False

    @property
    def ready(self) -> bool:
        return bool(self.namespace and self.name) and not self.ended


class ConsoleUpstream:
    def __init__(
        self,
        *,
        locate: Callable[[], Awaitable[ConsoleLocation]],
        on_output: Callable[[bytes], Awaitable[None]],
        on_state: Callable[[UpstreamState, str], Awaitable[None]],
        attempt_changed: asyncio.Event,
    ) -> None:
        self.locate = locate
        self.on_output = on_output
        self.on_state = on_state
        self.attempt_changed = attempt_changed
        self.state: UpstreamState | None = None
        self.socket: aiohttp.ClientWebSocketResponse | None = None

    async def _set_state(self, state: UpstreamState, detail: str = "") -> None:
        if state != self.state:
            self.state = state
            await self.on_state(state, detail)

    async def send(self, data: bytes) -> bool:
        socket = self.socket
        if socket is None or socket.closed:
            return False
        try:
            await socket.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError):
            return False
        return True

    async def run(self) -> None:
        """Connect, pump output, reconnect; returns only when cancelled."""
        # virtctl retries every second while the VMI is not running yet (400).
        retry, max_backoff = settings.CONSOLE_UPSTREAM_RETRY_SECONDS, settings.CONSOLE_UPSTREAM_MAX_BACKOFF_SECONDS
        backoff = retry
        timeout = aiohttp.ClientWSTimeout(ws_close=2.0)
        async with aiohttp.ClientSession() as session:
            while True:
                # Cleared before the lookup: an update that lands while it runs still wakes the wait below.
                self.attempt_changed.clear()
                location = await self.locate()
                if location.ended:
                    await self._set_state(UpstreamState.ENDED)
                    await wait_event(self.attempt_changed, 30.0)
                    continue
                if not location.ready:
                    await self._set_state(UpstreamState.WAITING)
                    await wait_event(self.attempt_changed, retry * 5)
                    continue
                if self.state is None:
                    await self._set_state(UpstreamState.CONNECTING)
                try:
                    path = vmi_subresource_path(namespace=location.namespace, name=location.name, subresource="console")
                    # Loading the configuration reads files and may refresh a token: keep it off the event loop.
                    target = await asyncio.to_thread(stream_target, path)
                    socket = await session.ws_connect(
                        target.url,
                        protocols=(CONSOLE_SUBPROTOCOL,),
                        headers=target.headers,
                        ssl=target.ssl if target.ssl is not None else True,
                        timeout=timeout,
                        server_hostname=target.server_hostname,
                        proxy=target.proxy,
                        max_msg_size=settings.CONSOLE_UPSTREAM_MAX_MESSAGE_BYTES,
                        autoping=True,
                    )
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status in (400, 404):
                        await self._set_state(UpstreamState.WAITING)
                        await asyncio.sleep(retry)
                    elif exc.status == 409:
                        await self._set_state(UpstreamState.FAILED)
                        await wait_event(self.attempt_changed, max_backoff)
                    else:
                        await self._set_state(UpstreamState.LOST, f"HTTP {exc.status}")
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, max_backoff)
                    continue
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    logger.warning("Console upstream for %s/%s unreachable: %s", location.namespace, location.name, exc)
                    await self._set_state(UpstreamState.LOST, type(exc).__name__)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, max_backoff)
                    continue
                backoff = retry
                await self._pump(socket)
                await self._set_state(UpstreamState.LOST)
                await asyncio.sleep(0.2)  # a VMI that just stopped: let the lifecycle's update arrive first

    async def _pump(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=READ_QUEUE_FRAMES)

        async def read() -> None:
            try:
                async for message in socket:
                    if message.type == aiohttp.WSMsgType.BINARY:
                        await queue.put(message.data)
                    elif message.type == aiohttp.WSMsgType.ERROR:
                        break
            except (aiohttp.ClientError, ConnectionError) as exc:
                logger.warning("Console upstream read failed: %s", exc)
            await queue.put(None)  # the end of the stream (not reached when cancelled: nobody waits then)

        reader = asyncio.create_task(read(), name="console-upstream-read")
        try:
            await self._set_state(UpstreamState.CONNECTED)
            while True:
                first = await queue.get()
                if first is None:
                    return
                chunk, ended = bytearray(first), False
                while len(chunk) < BATCH_BYTES and not queue.empty():
                    item = queue.get_nowait()
                    if item is None:
                        ended = True
                        break
                    chunk += item
                await self.on_output(bytes(chunk))
                if ended:
                    return
        finally:
            self.socket = None
            await cancel_and_wait(reader)
            await socket.close()
