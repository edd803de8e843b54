"""``/ws/attempts/<id>/console/``: the browser side of the console bridge; one viewer per socket, one of them per
attempt holding the upstream (docs/console.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from labs.console.access import ConsoleAccess, console_access, console_location
from labs.console.flow import InputRateLimiter, OutputWindow
from labs.console.state import ScrollbackSnapshot, console_state
from labs.console.upstream import ConsoleLocation, UpstreamState
from labs.consumers.console_holder import ConsoleHolder
from labs.consumers.console_keyboard import ConsoleKeyboard
from labs.selectors import console_stage
from labs.services.events import attempt_group
from portal.errors import ApplicationError
from portal.metrics import aconsole_session_closed
from portal.waiting import cancel_and_wait
from portal.websockets import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED, PortalConsumer

logger = logging.getLogger(__name__)

_console_access = database_sync_to_async(console_access, thread_sensitive=False)
_console_location = database_sync_to_async(console_location, thread_sensitive=False)

# The handshake's console location stands in for the first dial's lookup only if that dial follows this closely.
HANDSHAKE_LOCATION_FRESH_SECONDS = 2.0


def console_group(attempt_id: int) -> str:
    return f"console-{int(attempt_id)}"


def console_input_group(attempt_id: int) -> str:
    return f"console-input-{int(attempt_id)}"


# PortalConsumer's send is AsyncConsumer's (one message), which the WebSocket send calls through the MRO.
class AttemptConsoleConsumer(  # type: ignore[misc]
    ConsoleHolder, ConsoleKeyboard, AsyncWebsocketConsumer, PortalConsumer
):
    # None until the handshake grants access; the parts (ConsolePart) run only after it.
    access: ConsoleAccess | None = None  # type: ignore[assignment]
    ownership_task: asyncio.Task | None = None
    handshake_location: tuple[ConsoleLocation, float] | None = None
    leaving: asyncio.Future | None = None

    # -- connection ---------------------------------------------------------------------------------------

    async def connect(self) -> None:
        self.attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        self.user = self.scope.get("user")
        await self.join_session()
        try:
            # Not thread-sensitive, so handshakes do not queue on the process's one thread for such code.
            access = await _console_access(user=self.user, attempt_id=self.attempt_id)
        except ApplicationError:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        if access is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.access = access
        self.handshake_location = (access.location, time.monotonic())
        self.can_write = access.is_student
        self.state = console_state()
        self.window = OutputWindow(window=settings.CONSOLE_OUTPUT_WINDOW_BYTES)
        self.input_limiter = InputRateLimiter(
            rate=settings.CONSOLE_INPUT_RATE_BYTES_PER_SECOND, burst=settings.CONSOLE_INPUT_BURST_BYTES
        )
        self.deliver_lock = asyncio.Lock()
        self.owner_gone = asyncio.Event()
        self.ownership_changed = asyncio.Event()  # the upstream ended
        self.attempt_changed = asyncio.Event()
        self.notices_sent: dict[str, float] = {}

        self.output_group = console_group(self.attempt_id)
        self.input_group = console_input_group(self.attempt_id)
        self.events_group = attempt_group(self.attempt_id)
        # The output group before the snapshot: output in between is past the snapshot's end, delivered after it.
        await self.channel_layer.group_add(self.output_group, self.channel_name)
        await self.channel_layer.group_add(self.events_group, self.channel_name)
        others = await self.state.viewer_add(attempt_id=self.attempt_id, viewer=self.channel_name)
        snapshot = await self.state.scrollback_snapshot(attempt_id=self.attempt_id)
        await self._control_at_connect()
        await self.accept()
        await self._send_hello(replay=len(snapshot.data), size=await self.state.size_get(attempt_id=self.attempt_id))
        await self._replay(snapshot)
        if others:
            # Alone there is nobody to ask; a holder that takes the lease later sees this viewer registered.
            await self._announce()
        if not access.is_student:
            await self._broadcast_notice("staff_watching", who=access.viewer_name)
        self.ownership_task = asyncio.create_task(self._ownership_loop(), name=f"console-{self.attempt_id}-lease")

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A consumer can end without disconnect() (cancelled, or failed in a handler): hand back all the same.
            await self._leave_once()

    async def disconnect(self, code: int) -> None:
        await self._leave_once()

    async def _leave_once(self) -> None:
        if self.access is None:
            return  # refused before accept: nothing was set up
        # Shielded, since daphne may cancel the consumer meanwhile; kept on the consumer, since once the shield's
        # waiter is cancelled nothing else holds the task.
        if self.leaving is None:
            self.leaving = asyncio.ensure_future(self._leave())
        await asyncio.shield(self.leaving)

    async def _leave(self) -> None:
        steps = (
            # Whatever the cancelled ownership loop was taking or handing over, _stop_owning finishes the job.
            self._end_ownership_loop,
            self._end_sizing,
            self._end_control,
            lambda: self._stop_owning(release=True),
            lambda: self.state.viewer_remove(attempt_id=self.attempt_id, viewer=self.channel_name),
            lambda: self.channel_layer.group_discard(self.output_group, self.channel_name),
            lambda: self.channel_layer.group_discard(self.events_group, self.channel_name),
        )
        for step in steps:
            # One step failing (Redis briefly unreachable, say) does not keep the others from handing back theirs.
            try:
                await step()
            except Exception:
                logger.exception("Console %s: leaving failed in part", self.attempt_id)
        await aconsole_session_closed()  # opened was counted with the handshake that granted access

    async def _end_ownership_loop(self) -> None:
        if self.ownership_task is not None:
            await cancel_and_wait(self.ownership_task)

    # -- bridge → browser ---------------------------------------------------------------------------------

    async def _send_hello(self, *, replay: int = 0, size: tuple[int, int] | None = None) -> None:
        """``replay`` bytes of scrollback follow, written at the guest's ``size`` (cols, rows): the page draws them
        at that size, then fits its window and reflows."""
        assert self.access is not None  # sent only on an accepted socket
        hello = {
            "type": "hello",
            "attempt": self.attempt_id,
            "mode": "rw" if self.can_write else "ro",
            "can_take_control": not self.access.is_student,
            "keyboard": self.keyboard,
        }
        if size is not None:
            hello.update(replay=replay, cols=size[0], rows=size[1])
        await self._send_json(hello)

    async def _announce(self) -> None:
        """Ask the holder (named by the lease, so one message, not one to every tab) for the upstream's state and
        where the output stands (``console_viewer_joined``)."""
        holder = await self.state.get("lease", self.attempt_id)
        if holder is None or holder == self.channel_name:
            return
        try:
            await self.channel_layer.send(holder, {"type": "console.viewer_joined", "reply_to": self.channel_name})
        except ChannelFull:
            logger.info("Console %s: the holder's channel is full; asking again later", self.attempt_id)

    # -- browser → bridge ---------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None:
            await self._input(bytes_data)
            return
        try:
            message = json.loads(text_data or "")
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser follows
            await self._notice("bad_message")
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "ack":
            await self._acknowledge(message.get("bytes"))
        elif kind == "take_control":
            await self._set_control(taken=True)
        elif kind == "release_control":
            await self._set_control(taken=False)
        elif kind == "resize":
            await self._resize(message)
        elif kind == "ping":
            await self._send_json({"type": "pong"})
        else:
            await self._notice("bad_message")

    async def _input(self, data: bytes) -> None:
        assert self.access is not None  # input arrives only on an accepted socket
        if not self.can_write:
            if self.access.is_student and self.keyboard:
                await self._notice("keyboard_held", who=self.keyboard)  # staff hold the keyboard for now
            else:
                await self._notice("read_only")
            return
        if len(data) > settings.CONSOLE_INPUT_FRAME_MAX_BYTES:
            await self._notice("input_too_large")
            return
        if not self.input_limiter.allow(len(data)):
            await self._notice("input_rate")
            return
        if self.upstream is not None:
            if not await self.upstream.send(data):
                await self._notice("not_connected")
        else:
            await self.channel_layer.group_send(self.input_group, {"type": "console.input", "data": data})

    async def _acknowledge(self, total: object) -> None:
        if not isinstance(total, int) or isinstance(total, bool):
            await self._notice("bad_message")
            return
        if self.window.acknowledge(total):
            await self._redraw()

    async def _deliver_locked(self, data: bytes, end: int) -> None:
        """Send one chunk of output (ending at offset ``end``) unless already sent or the browser is behind. One
        starting past what this browser has means output went missing (a full channel, a holder that did not know
        of this viewer yet): the screen is redrawn from the scrollback, which holds everything published."""
        if end <= self.delivered_end:
            return
        if self.window.lagging_since is not None:  # skipped: the catch-up redraw replaces it
            self.delivered_end = end
            return
        start = end - len(data)
        if start > self.delivered_end:
            await self._redraw_locked()
            if end <= self.delivered_end:
                return
        if start < self.delivered_end:
            data = data[self.delivered_end - start :]
        self.delivered_end = end
        if not self.window.may_send(len(data)):
            await self._send_json({"type": "lagging"})
            return
        # Counted before sending: the browser's acknowledgement may be handled before send() returns.
        self.window.record_sent(len(data))
        await self.send(bytes_data=data)

    async def _redraw(self) -> None:
        """A lagging browser caught up: give it a fresh screen from scrollback instead of the skipped bytes."""
        async with self.deliver_lock:
            await self._redraw_locked()

    async def _redraw_locked(self) -> None:
        if self.fanout is not None:
            # The holder's own tab runs ahead of the scrollback: the snapshot must end where its next chunk starts.
            await self.fanout.flush()
        snapshot = await self.state.scrollback_snapshot(attempt_id=self.attempt_id)
        cols, rows = await self.state.size_get(attempt_id=self.attempt_id)
        await self._send_json({"type": "reset", "replay": len(snapshot.data), "cols": cols, "rows": rows})
        await self._replay(snapshot)

    async def _replay(self, snapshot: ScrollbackSnapshot) -> None:
        if snapshot.data:
            self.window.record_sent(len(snapshot.data))
            await self.send(bytes_data=snapshot.data)
        self.delivered_end = snapshot.end

    async def console_output(self, event: dict) -> None:
        if event.get("origin") != self.channel_name:
            async with self.deliver_lock:
                await self._deliver_locked(event["data"], event["end"])

    async def console_sync(self, event: dict) -> None:
        if event["end"] > self.delivered_end:
            await self._redraw()

    # -- channel layer handlers ---------------------------------------------------------------------------

    async def console_status(self, event: dict) -> None:
        if event.get("origin") != self.channel_name:
            await self._send_status(event["state"], event.get("detail", ""))

    async def console_owner_gone(self, event: dict) -> None:
        self.owner_gone.set()

    async def console_notice(self, event: dict) -> None:
        if event.get("origin") == self.channel_name:
            return
        await self._send_json({"type": "notice", **{k: v for k, v in event.items() if k not in ("type", "origin")}})

    async def attempt_update(self, event: dict) -> None:
        # While the console waits for its VMI, only an update that can end the wait is worth a database lookup.
        attempt = event["attempt"]
        if self.upstream is not None and self.upstream.state == UpstreamState.WAITING:
            if console_stage(state=attempt["state"], phase=attempt["phase"]) == "waiting":
                return
        self.attempt_changed.set()

    async def _locate(self) -> ConsoleLocation:
        # The handshake's location serves the first dial while fresh and ready (a page opens its console once the
        # VMI runs); any other is looked up afresh, so an update that came in between is not missed.
        early, self.handshake_location = self.handshake_location, None
        if early is not None and early[0].ready and time.monotonic() - early[1] < HANDSHAKE_LOCATION_FRESH_SECONDS:
            return early[0]
        return await _console_location(user=self.user, attempt_id=self.attempt_id)
