"""``/ws/attempts/<id>/console/``: the browser side of the console bridge; one viewer per socket, one of them per
attempt holding the upstream (docs/console.md)."""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from labs.console.access import ConsoleAccess, console_access, console_location
from labs.console.flow import InputRateLimiter, OutputWindow
from labs.console.stage import console_stage
from labs.console.state import console_state
from labs.console.upstream import ConsoleLocation, UpstreamState
from labs.consumers.console_control import ConsoleControl
from labs.consumers.console_holder import ConsoleHolder
from labs.consumers.console_size import ConsoleSizing
from labs.consumers.console_stream import ConsoleStream
from labs.services.events import attempt_group
from portal.errors import ApplicationError
from portal.metrics import aconsole_session_closed, console_session_opened
from portal.waiting import cancel_and_wait
from portal.websockets import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED, PortalConsumer

logger = logging.getLogger(__name__)

_console_location = database_sync_to_async(console_location, thread_sensitive=False)

# The handshake's console location stands in for the first dial's lookup only if that dial follows this closely
# (a viewer that takes over from a holder later looks the attempt up again).
HANDSHAKE_LOCATION_FRESH_SECONDS = 2.0


def console_handshake(*, user, attempt_id: int) -> ConsoleAccess | None:
    """The viewer's access, or None without a logged-in session. ``user`` may be the lazy ``scope["user"]``
    (portal.websockets): it is resolved here, in sync code."""
    if user is None or not user.is_authenticated:
        return None
    access = console_access(user=user, attempt_id=attempt_id)
    console_session_opened()  # counted here, in the handshake's thread call, rather than in one more of its own
    return access


def console_group(attempt_id: int) -> str:
    return f"console-{int(attempt_id)}"


def console_input_group(attempt_id: int) -> str:
    return f"console-input-{int(attempt_id)}"


# PortalConsumer's send is AsyncConsumer's (one message), which the WebSocket send calls through the MRO.
class AttemptConsoleConsumer(  # type: ignore[misc]
    ConsoleHolder, ConsoleStream, ConsoleSizing, ConsoleControl, AsyncWebsocketConsumer, PortalConsumer
):
    # None until the handshake grants access; the parts (ConsolePart) run only after it.
    access: ConsoleAccess | None = None  # type: ignore[assignment]
    ownership_task: asyncio.Task | None = None
    handshake_location: tuple[ConsoleLocation, float] | None = None
    leaving: asyncio.Future | None = None
    # What this viewer may have taken as holder and must hand back: set before the step that takes it, since a
    # cancellation can land after Redis did the work but before its answer arrived.
    lease_claimed = False
    in_input_group = False
    status_seen = False

    # -- connection ---------------------------------------------------------------------------------------

    async def connect(self) -> None:
        self.attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        self.user = self.scope.get("user")
        try:
            # One thread-pool call resolves the session's user and decides access; not thread-sensitive, so
            # handshakes do not queue one after another on the process's single thread for such code.
            access = await database_sync_to_async(console_handshake, thread_sensitive=False)(
                user=self.user, attempt_id=self.attempt_id
            )
        except ApplicationError:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        if access is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.access = access
        self.handshake_location = (access.location, time.monotonic())
        self.can_write = access.can_type
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
        self.upstream = None
        self.upstream_task = None
        self.recorder = None
        self.fanout = None

        self.output_group = console_group(self.attempt_id)
        self.input_group = console_input_group(self.attempt_id)
        self.events_group = attempt_group(self.attempt_id)
        # Join the output group before taking the scrollback snapshot: output produced in between carries an
        # offset past the snapshot's end and is delivered after it; anything older is skipped.
        await self.channel_layer.group_add(self.output_group, self.channel_name)
        await self.channel_layer.group_add(self.events_group, self.channel_name)
        others = await self.state.viewer_add(attempt_id=self.attempt_id, viewer=self.channel_name)
        snapshot = await self.state.scrollback_snapshot(attempt_id=self.attempt_id)
        await self._control_at_connect()
        await self.accept()
        await self._send_hello(replay=len(snapshot.data), size=await self.state.size_get(attempt_id=self.attempt_id))
        if snapshot.data:
            self.window.record_sent(len(snapshot.data))
            await self.send(bytes_data=snapshot.data)
        self.delivered_end = snapshot.end
        if others:
            # Alone (the usual single tab) there is nobody to ask. Registered before the lease is read: a holder
            # that takes it meanwhile sees this viewer among the others, and tells the group its state.
            await self._announce()
        if access.is_staff and not access.is_student:
            await self._broadcast_notice("staff_watching", who=access.viewer_name)
        self.ownership_task = asyncio.create_task(self._ownership_loop(), name=f"console-{self.attempt_id}-lease")

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A consumer can end without disconnect(): cancelled by the server, or failed in a handler. What it
            # holds is handed back all the same.
            await self._leave_once()

    async def disconnect(self, code: int) -> None:
        await self._leave_once()

    async def _leave_once(self) -> None:
        if self.access is None:
            return  # refused before accept: nothing was set up
        # Shielded: the consumer may be cancelled meanwhile (daphne gives up on one that takes 10 s, a test
        # communicator after 1 s), and the upstream, lease and registration must be handed back all the same. Kept
        # on the consumer: once the shield's waiter is cancelled, nothing else holds the task while it runs.
        if self.leaving is None:
            self.leaving = asyncio.ensure_future(self._leave())
        await asyncio.shield(self.leaving)

    async def _leave(self) -> None:
        steps = (
            # Whatever the ownership loop was doing when cancelled (taking the lease, handing it over), the second
            # step finishes handing back what it took.
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
            "can_take_control": self.access.is_staff and not self.access.is_student,
            "keyboard": self.keyboard,
        }
        if size is not None:
            hello.update(replay=replay, cols=size[0], rows=size[1])
        await self._send_json(hello)

    async def _announce(self) -> None:
        """Ask the holder for the upstream's state and where the output stands (``console_viewer_joined``). Only
        the holder answers, and the lease names its channel: a class's tabs opening together send one message
        each, not one to every tab already there."""
        holder = await self.state.get("lease", self.attempt_id)
        if holder is None or holder == self.channel_name:
            return
        try:
            await self.channel_layer.send(holder, {"type": "console.viewer_joined", "reply_to": self.channel_name})
        except ChannelFull:
            logger.info("Console %s: the holder's channel is full; asking again later", self.attempt_id)

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
        # The update carries the attempt's state and VMI phase: while the console waits for its VMI, only an
        # update that can change the answer (the VMI runs, or the attempt ended) is worth a database lookup.
        attempt = event.get("attempt")
        if isinstance(attempt, dict) and self.upstream is not None and self.upstream.state == UpstreamState.WAITING:
            if console_stage(state=attempt.get("state", ""), phase=attempt.get("phase", "")) == "waiting":
                return
        self.attempt_changed.set()

    # -- the holder's lookups --------------------------------------------------------------------------

    async def _locate(self) -> ConsoleLocation:
        # The location read with the handshake serves the first dial, while it is fresh and ready: a page opens its
        # console once the VMI runs, and then dials without a second lookup. One that was waiting or ended is looked
        # up afresh, as is every later dial, so an update that came in between is not missed.
        early, self.handshake_location = self.handshake_location, None
        if early is not None and early[0].ready and time.monotonic() - early[1] < HANDSHAKE_LOCATION_FRESH_SECONDS:
            return early[0]
        # Not thread-sensitive: a class's consoles looking up their attempts together must not queue on the
        # process's one thread for such code.
        return await _console_location(user=self.user, attempt_id=self.attempt_id)
