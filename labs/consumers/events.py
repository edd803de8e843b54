"""``/ws/attempts/<id>/events/``: the attempt's status and grading results, pushed as they change.

Joined to the channel-layer group ``attempt-<id>``, which the lifecycle (``attempt.update``) and grading
(``grading.update``) push to after commit. On connect the current status (and the latest grading run) is sent
first, so a page that reconnects after a gap shows the present state without polling. Messages are in the
language of the page that opened the socket (``portal.websocket_language``): the snapshot is built in it, and a
push that carries its words in every language (a grading run's ``runs``, an attempt's ``wording``) is answered
with this socket's.

The student's own page keeps their attempt from being stopped as left (``Lab.idle_stop_minutes``): where the lab
does that, the socket stamps the attempt as seen when it opens, every ``PRESENCE_STAMP_SECONDS`` while open, and as
it closes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import translation

from labs.access import attempt_get_for_user
from labs.models import ACTIVE_STATES
from labs.selectors import attempt_status_payload
from labs.services.presence import PRESENCE_STAMP_SECONDS, attempt_seen
from labs.signals import socket_parts
from portal.errors import ApplicationError
from portal.websocket_consumer import PortalConsumer
from portal.websocket_language import scope_language

logger = logging.getLogger(__name__)

# Close codes the page understands (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


def attempt_group(attempt_id: int) -> str:
    return f"attempt-{int(attempt_id)}"


@dataclass(frozen=True)
class Handshake:
    messages: list[dict]
    # The student's own page on a lab that stops attempts nobody has open: the socket stamps the attempt as seen.
    stamps_presence: bool = False


def _initial(*, user, attempt_id: int) -> Handshake:
    attempt = attempt_get_for_user(user=user, attempt_id=attempt_id, related=False, with_idle_stop=True)
    # The student's own page keeps the attempt from being stopped as left, where the lab does that.
    idle_stop = attempt.lab_idle_stop_minutes  # type: ignore[attr-defined]  # annotated by with_idle_stop
    stamps = bool(attempt.student_id == user.pk and attempt.state in ACTIVE_STATES and idle_stop)
    if stamps:
        attempt_seen(attempt_id=attempt.id)
    messages: list[dict] = [{"type": "attempt.update", "attempt": attempt_status_payload(attempt)}]
    for part in socket_parts:  # given the attempt just checked above, so scoped like it
        messages.extend(part(attempt))
    return Handshake(messages=messages, stamps_presence=stamps)


class NotAuthenticated(Exception):
    """The handshake carries no logged-in session."""


def refusal_close_code(exc: Exception) -> int:
    """The close code for a socket refused with ``exc``: no session (4401) or nothing this user may see (4404)."""
    return CLOSE_UNAUTHENTICATED if isinstance(exc, NotAuthenticated) else CLOSE_NOT_FOUND


def attempt_events_handshake(*, user, attempt_id: int, language: str) -> Handshake:
    """Everything a handshake needs from the database, in one call: the session's user (``user`` may be the lazy
    ``scope["user"]``, resolved here), the access decision and the snapshot, in ``language``. Raises
    ``NotAuthenticated`` or ``NotFound``."""
    if user is None or not user.is_authenticated:
        raise NotAuthenticated
    with translation.override(language):
        return _initial(user=user, attempt_id=attempt_id)


# One thread-pool call per handshake. Not thread-sensitive: channels' default would run every handshake of the
# process on one shared thread, one after another, and a class opening its pages together would wait past
# daphne's connect timeout. database_sync_to_async closes stale connections around the call in its thread.
_handshake = database_sync_to_async(attempt_events_handshake, thread_sensitive=False)
# While the student's page is open its socket stamps the attempt every PRESENCE_STAMP_SECONDS, and once more as it
# closes (the dashboard reads the same figure to tell whether any page has it open).
_seen = database_sync_to_async(attempt_seen, thread_sensitive=False)


# PortalConsumer's send is AsyncConsumer's (one message), which the WebSocket send calls through the MRO.
class AttemptEventsConsumer(AsyncJsonWebsocketConsumer, PortalConsumer):  # type: ignore[misc]
    group: str | None = None
    language: str = ""
    attempt_id: int = 0
    presence: asyncio.Task | None = None

    async def connect(self) -> None:
        """Join the attempt's group, then read its snapshot, deciding access: an update committed in between is
        delivered after the snapshot, never lost (group messages wait until this handler returns)."""
        attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        self.language = scope_language(self.scope)
        group = attempt_group(attempt_id)
        await self.channel_layer.group_add(group, self.channel_name)
        try:
            handshake = await _handshake(user=self.scope.get("user"), attempt_id=attempt_id, language=self.language)
        except (NotAuthenticated, ApplicationError) as exc:
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.close(code=refusal_close_code(exc))
            return
        self.group = group
        self.attempt_id = attempt_id
        await self.accept()
        # Keep the attempt from being stopped as left while the socket is open, where it should.
        for message in handshake.messages:
            await self.send_json(message)
        if handshake.stamps_presence:
            self.presence = asyncio.ensure_future(self._stamp_presence())

    async def _stamp_presence(self) -> None:
        """Stamp the attempt as seen while the page is open (the handshake stamped it first)."""
        while True:
            await asyncio.sleep(PRESENCE_STAMP_SECONDS)
            try:
                if not await _seen(attempt_id=self.attempt_id):
                    return  # ended: nothing left to keep
            except Exception:
                # A database hiccup costs one stamp; the next one, a minute on, makes up for it.
                logger.warning("could not stamp attempt %s as seen", self.attempt_id, exc_info=True)

    async def disconnect(self, code: int) -> None:
        if self.presence is not None:
            self.presence.cancel()
            self.presence = None
            try:
                await _seen(attempt_id=self.attempt_id)  # the page left now: the stop when left counts from here
            except Exception:
                logger.warning("could not stamp attempt %s as seen", self.attempt_id, exc_info=True)
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """The page only listens; a ping keeps proxies from closing an idle socket. Anything else (not JSON, a
        binary frame, another type) is answered with ``bad_message`` rather than left to end the consumer, which
        would skip its cleanup."""
        try:
            content = await self.decode_json(text_data) if text_data is not None else None
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser follows
            content = None
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "code": "bad_message"})

    async def attempt_update(self, event: dict) -> None:
        if self.group is None:
            return  # refused: a message that reached the channel before it left the group is not for this socket
        attempt = event["attempt"]
        for key, texts in (event.get("wording") or {}).items():
            if texts.get(self.language):
                attempt = {**attempt, key: texts[self.language]}
        await self.send_json({"type": "attempt.update", "attempt": attempt})

    async def grading_update(self, event: dict) -> None:
        if self.group is None:
            return
        run = (event.get("runs") or {}).get(self.language) or event["run"]
        await self.send_json({"type": "grading.update", "run": run})
