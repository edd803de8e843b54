"""The console's database side: who may use an attempt's console (its student types, course staff watch and may take
over, audited; anybody else gets the not-found of a missing attempt), where its VMI is, and its size set through the
agent."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from labs.access import attempt_get_for_user
from labs.console.upstream import ConsoleLocation
from labs.models import Attempt
from labs.selectors import console_stage
from portal.metrics import console_session_opened
from portal.models import User
from portal.services import audit_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsoleAccess:
    is_student: bool  # who types; anybody else labs.access lets in teaches the course: they watch, may take over
    viewer_name: str
    # Where the console was as access was decided (read with it): the first dial needs no lookup of its own.
    location: ConsoleLocation


def console_access(*, user: User | None, attempt_id: int) -> ConsoleAccess | None:
    """None without a logged-in session (``user`` may be the lazy ``scope["user"]``, resolved here); raises NotFound
    unless the user is the attempt's student or staff of its course."""
    if user is None or not user.is_authenticated:
        return None
    attempt = attempt_get_for_user(user=user, attempt_id=attempt_id, related=False)
    console_session_opened()  # counted in the handshake's thread call rather than in one more of its own
    return ConsoleAccess(is_student=attempt.student_id == user.id, viewer_name=str(user), location=_location(attempt))


def console_location(*, user: User, attempt_id: int) -> ConsoleLocation:
    return _location(attempt_get_for_user(user=user, attempt_id=attempt_id, related=False))


def _location(attempt: Attempt) -> ConsoleLocation:
    stage = console_stage(state=attempt.state, phase=attempt.phase)
    if stage == "ended":
        return ConsoleLocation(ended=True)
    if stage == "waiting":
        return ConsoleLocation()
    return ConsoleLocation(namespace=attempt.namespace, name=attempt.vm_name)


@transaction.atomic
def console_control_record(*, actor: User, attempt_id: int, taken: bool) -> None:
    """Audit a staff member taking over (or handing back) the keyboard of a student's console."""
    attempt = attempt_get_for_user(user=actor, attempt_id=attempt_id)
    audit_record(
        actor=actor,
        action="console.take_control" if taken else "console.release_control",
        target=attempt,
        tenant=attempt.tenant,
        course=attempt.lab.course,
        data={"attempt": attempt.id},
    )


def console_resize(*, user: User, attempt_id: int, rows: int, cols: int) -> bool:
    """Ask the attempt's agent to set its serial console's size. False when it cannot (no agent answering, a
    guest without one): the caller may then type ``stty`` instead."""
    from labs.agent_client import AgentError, set_tty_size

    attempt = attempt_get_for_user(user=user, attempt_id=attempt_id, related=False)
    if console_stage(state=attempt.state, phase=attempt.phase) != "ready":
        return False
    try:
        set_tty_size(attempt, rows=rows, cols=cols)
    except AgentError as error:
        logger.info("attempt %s: console size not set through the agent (%s: %s)", attempt_id, error.code, error)
        return False
    return True
