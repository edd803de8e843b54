"""``/ws/attempts/<id>/events/``: the attempt's status, grading results and cluster notice (group ``attempt-<id>``),
the present state first, in the page's language; the student's own page stamps the attempt as seen while open,
where its lab stops attempts nobody has open (``Lab.idle_stop_minutes``)."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.utils import translation

from labs.access import attempt_get_for_user
from labs.models import ACTIVE_STATES
from labs.selectors import attempt_status_payload
from labs.services.events import attempt_group
from labs.services.stopping import PRESENCE_STAMP_SECONDS, attempt_seen
from labs.signals import attempt_socket_opened
from labs.wording import cluster_notice, in_language
from portal.websockets import NotAuthenticated, PageSocketConsumer, scope_language

logger = logging.getLogger(__name__)


def attempt_events_handshake(*, user, attempt_id: int, language: str, notice: bool = False) -> tuple[list[dict], bool]:
    """The handshake's one database call: the session's user (the lazy ``scope["user"]``), access, the first messages
    in ``language`` and whether the socket stamps the attempt as seen. Raises ``NotAuthenticated`` or ``NotFound``.
    ``notice``: the page shows a cluster notice, which may have ended since it was drawn; the present one follows."""
    if user is None or not user.is_authenticated:
        raise NotAuthenticated
    with translation.override(language):
        attempt = attempt_get_for_user(user=user, attempt_id=attempt_id, related=False, with_idle_stop=True)
        idle_stop = attempt.lab_idle_stop_minutes  # type: ignore[attr-defined]  # annotated by with_idle_stop
        # The student's own page on a lab that stops attempts nobody has open.
        stamps = bool(attempt.student_id == user.pk and attempt.state in ACTIVE_STATES and idle_stop)
        if stamps:
            attempt_seen(attempt_id=attempt.id)
        messages: list[dict] = [{"type": "attempt.update", "attempt": attempt_status_payload(attempt)}]
        for _receiver, part in attempt_socket_opened.send(sender=None, attempt=attempt):
            messages.extend(part)  # type: ignore[arg-type]  # the stubs type a response as str
        if notice:
            now = cluster_notice(state=attempt.state, namespace=attempt.namespace) or ""
            messages.append({"type": "cluster.notice", "notice": now})
    return messages, stamps


# Not thread-sensitive: channels' default would run every handshake of the process on one shared thread, one after
# another, and a class opening its pages together would wait past daphne's connect timeout.
_handshake = database_sync_to_async(attempt_events_handshake, thread_sensitive=False)
_seen = database_sync_to_async(attempt_seen, thread_sensitive=False)


class AttemptEventsConsumer(PageSocketConsumer):
    language: str = ""
    attempt_id: int = 0
    presence: asyncio.Task | None = None

    async def connect(self) -> None:
        self.attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        self.language = scope_language(self.scope)
        notice = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get("notice") == ["1"]
        handshake = await self.join_and_accept(
            attempt_group(self.attempt_id),
            lambda: _handshake(
                user=self.scope.get("user"), attempt_id=self.attempt_id, language=self.language, notice=notice
            ),
        )
        if handshake is None:
            return
        messages, stamps_presence = handshake
        for message in messages:
            await self.send_json(message)
        if stamps_presence:
            self.presence = asyncio.ensure_future(self._stamp_presence())

    async def _stamp_presence(self) -> None:
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
        await super().disconnect(code)

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

    async def cluster_notice(self, event: dict) -> None:
        if self.group is None:
            return
        await self.send_json({"type": "cluster.notice", "notice": in_language(event["texts"], "", self.language)})
