"""``/ws/labs/<id>/events/``: the lab page's socket, over which Start is pressed; then the new attempt's events.

A student's lab page opens it as it loads, before Start (``static/js/start.js``). Pressing Start sends
``{"type": "start"}`` on it and the answer comes back on it: ``start.answer`` with what the HTTP Start answers (the
attempt's status, its panel and its history row), or ``start.refused`` with the refusal's code, message and
Retry-After. From then on the socket is that attempt's events socket (``AttemptEventsConsumer``): it has joined the
attempt's group and sent its snapshot, and the page's ``attempt.js`` takes it over. A class pressing Start together
thus costs the portal a message on a socket each, not an HTTP request and a second socket handshake each.

The same service decides as for the HTTP Start and the API's (``attempt_start_limited``: the start limit, the
lab's window, the quotas, one attempt at a time). A start over a WebSocket is a state change without Django's CSRF
middleware: what stands in for it is the Origin check every portal socket passes (``portal.websocket_gate``:
a page of another site cannot open this socket with the student's cookies), and the session's user, as for a
page. The socket is refused (4401, 4404) unless the user is a student of the lab's course; staff have no Start.
The panel's forms get the page's own CSRF token, made from the CSRF cookie the handshake carried.

A failure the student did not cause is answered like an HTTP request's (``portal.server_errors``): ``portal_busy``
with Retry-After when no database connection came free in time, ``server_error`` otherwise, logged and counted;
the socket stays open and the page may try again.
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone, translation

from grading.selectors import lab_get_for_student, student_role_shown
from labs.consumers.events import AttemptEventsConsumer, NotAuthenticated, refusal_close_code
from labs.selectors import attempt_status_payload
from labs.services import attempt_start_limited
from labs.views.pages import lab_start_fragments
from portal.errors import ApplicationError
from portal.server_errors import failure_answer
from portal.timezones import user_time_zone
from portal.websocket_language import scope_language

logger = logging.getLogger(__name__)

# Django's CSRF secret, as the cookie carries it (django.middleware.csrf: CSRF_SECRET_LENGTH allowed characters).
CSRF_SECRET_LENGTH = 32
CSRF_SECRET_CHARS = frozenset(string.ascii_letters + string.digits)


def lab_socket_access(*, user, lab_id: int) -> None:
    """May this socket's user press Start on the lab? Raises ``NotAuthenticated`` or ``NotFound`` (the same for a lab
    that does not exist and one of a course the user does not take as a student)."""
    if user is None or not user.is_authenticated:
        raise NotAuthenticated
    lab_get_for_student(user=user, lab_id=lab_id)


def panel_request(*, user, csrf_cookie: str | None, language: str) -> HttpRequest:
    """A request as the panel's templates need one: the user, the language, and the page's CSRF secret (from its
    cookie) so that the panel's Stop, Extend and Check forms carry a token the page's cookie matches."""
    request = HttpRequest()
    request.user = user
    request.LANGUAGE_CODE = language
    if csrf_cookie and len(csrf_cookie) == CSRF_SECRET_LENGTH and set(csrf_cookie) <= CSRF_SECRET_CHARS:
        request.META["CSRF_COOKIE"] = csrf_cookie
    return request


@dataclass
class StartOutcome:
    """The answer to a Start pressed on the socket: ``answer`` to send, and the attempt to follow if one started
    (with the ``updated_at`` its answer shows, and whether its page keeps it from being stopped as left)."""

    answer: dict[str, Any]
    attempt_id: int | None = None
    updated_at: datetime | None = None
    stamps_presence: bool = False


def lab_socket_start(*, user, lab_id: int, language: str, csrf_cookie: str | None) -> StartOutcome:
    """Start an attempt of the lab for the socket's student, as the lab page's HTTP Start does, in ``language`` and
    the person's time zone (``portal.timezones``, as their pages are written in)."""
    with translation.override(language), timezone.override(user_time_zone(user)):
        try:
            lab = lab_get_for_student(user=user, lab_id=lab_id)
            attempt = attempt_start_limited(actor=user, lab=lab, role=student_role_shown(user=user))
        except ApplicationError as error:
            return StartOutcome({"type": "start.refused", "code": error.code, "error": error.message,
                                 "retry_after": error.retry_after, **error.extra})
        fragments = lab_start_fragments(
            request=panel_request(user=user, csrf_cookie=csrf_cookie, language=language), attempt=attempt)
        return StartOutcome({"type": "start.answer", "attempt": attempt_status_payload(attempt), **fragments},
                            attempt_id=attempt.id, updated_at=attempt.updated_at,
                            stamps_presence=bool(lab.idle_stop_minutes))


_access = database_sync_to_async(lab_socket_access, thread_sensitive=False)
_start = database_sync_to_async(lab_socket_start, thread_sensitive=False)


class LabEventsConsumer(AttemptEventsConsumer):
    lab_id: int

    async def connect(self) -> None:
        self.lab_id = int(self.scope["url_route"]["kwargs"]["lab_id"])
        self.language = scope_language(self.scope)
        try:
            await _access(user=self.scope.get("user"), lab_id=self.lab_id)
        except (NotAuthenticated, ApplicationError) as exc:
            await self.close(code=refusal_close_code(exc))
            return
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """``start`` until an attempt started here (later ones are the attempt socket's ``bad_message``); ``ping``."""
        if self.group is None and text_data is not None:
            try:
                content = await self.decode_json(text_data)
            except (ValueError, RecursionError):
                content = None
            if isinstance(content, dict) and content.get("type") == "start":
                await self.start()
                return
        await super().receive(text_data=text_data, bytes_data=bytes_data, **kwargs)

    async def start(self) -> None:
        csrf_cookie = (self.scope.get("cookies") or {}).get(settings.CSRF_COOKIE_NAME)
        try:
            outcome = await _start(user=self.scope.get("user"), lab_id=self.lab_id, language=self.language,
                                   csrf_cookie=csrf_cookie)
        except Exception as exc:
            logger.exception("Start on the socket of lab %s failed", self.lab_id)
            with translation.override(self.language):
                failure = failure_answer(exc)
            await self.send_json({"type": "start.refused", "code": failure.code, "error": failure.message,
                                  "retry_after": failure.retry_after})
            return
        await self.send_json(outcome.answer)
        if outcome.attempt_id is None:
            return
        try:
            handshake = await self.follow(outcome.attempt_id, started=outcome)
        except (NotAuthenticated, ApplicationError) as exc:  # the session ended in between
            await self.close(code=refusal_close_code(exc))
            return
        await self.deliver(handshake)
