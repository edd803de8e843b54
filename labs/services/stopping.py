"""Ending attempts: a person's stop and extension, the time limit, and the stop when nobody has the attempt open;
each becomes ``stopping`` and a task grades it once more and deletes the VM."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.models import ACTIVE_STATES, Attempt, AttemptState
from labs.services.events import attempt_push_on_commit, on_commit_logged
from labs.services.presence import attempt_left_since
from labs.states import attempt_transition
from portal.errors import Conflict, NotFound, PermissionDenied
from portal.models import Role, User
from portal.selectors import course_role
from portal.services import audit_record

logger = logging.getLogger(__name__)


class StopReason:
    STUDENT = "student"
    STAFF = "staff"
    EXPIRED = "expired"
    LEFT = "left"  # no page of the student had it open for the lab's ``idle_stop_minutes``


def enqueue_teardown(attempt_id: int) -> None:
    from labs.tasks import teardown_attempt

    on_commit_logged(lambda: teardown_attempt.delay(attempt_id), what=f"queueing teardown of {attempt_id}")


def _require_student_or_instructor(*, actor: User, attempt: Attempt, refusal: str) -> str:
    """The actor's standing for changing the attempt: its student, or an instructor of its course."""
    if attempt.student_id == actor.pk:
        return StopReason.STUDENT
    role = course_role(user=actor, course=attempt.lab.course)
    if role is None:
        raise NotFound(_("Attempt not found."))
    if role != Role.INSTRUCTOR:
        raise PermissionDenied(refusal)
    return StopReason.STAFF


def attempt_stop(*, actor: User, attempt: Attempt) -> Attempt:
    """Stop the attempt (one already stopping is left as it is)."""
    standing = _require_student_or_instructor(
        actor=actor, attempt=attempt, refusal=_("Only the student or an instructor can stop this lab.")
    )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
        if locked.state == AttemptState.STOPPING:
            return locked
        if locked.state not in ACTIVE_STATES:
            raise Conflict(_("This attempt has already ended."), code="attempt_ended")
        audit_record(
            actor=actor,
            action="attempt.stop",
            target=locked,
            tenant=locked.tenant,
            course=locked.lab.course,
            data={"from": locked.state, "by": standing},
        )
        _begin_stopping(locked, reason=standing, now=timezone.now())
    return locked


def _begin_stopping(locked: Attempt, *, reason: str, now: datetime) -> None:
    """On the attempt row the caller locked: ``stopping`` from now, for ``reason``, and the teardown queued."""
    attempt_transition(
        attempt=locked, to=AttemptState.STOPPING, from_states=(locked.state,), now=now, stop_reason=reason
    )
    enqueue_teardown(locked.id)


def attempt_extend(*, actor: User, attempt: Attempt) -> Attempt:
    """Add ``ATTEMPT_EXTEND_MINUTES`` to a running attempt's time limit, at most ``ATTEMPT_MAX_EXTENSIONS`` times."""
    _require_student_or_instructor(
        actor=actor, attempt=attempt, refusal=_("Only the student or an instructor can extend this lab.")
    )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
        if locked.state != AttemptState.RUNNING or locked.expires_at is None:
            raise Conflict(_("Only a running lab can be extended."), code="not_running")
        limit = settings.ATTEMPT_MAX_EXTENSIONS
        if locked.extensions >= limit:
            raise Conflict(
                _("This lab has already been extended %(limit)d times, the most allowed.") % {"limit": limit},
                code="extension_limit",
            )
        previous = locked.expires_at
        locked.expires_at = previous + timedelta(minutes=settings.ATTEMPT_EXTEND_MINUTES)
        locked.extensions += 1
        locked.save(update_fields=["expires_at", "extensions", "updated_at"])
        audit_record(
            actor=actor,
            action="attempt.extend",
            target=locked,
            tenant=locked.tenant,
            course=locked.lab.course,
            data={"from": previous.isoformat(), "to": locked.expires_at.isoformat(), "extensions": locked.extensions},
        )
        attempt_push_on_commit(attempt=locked)
    return locked


def attempt_stop_left(*, attempt: Attempt, now: datetime | None = None) -> Attempt:
    """Stop the running attempt if no page has had it open for its lab's ``idle_stop_minutes`` (reason ``left``)."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab").get(pk=attempt.pk)
        limit = locked.lab.idle_stop_minutes
        since = attempt_left_since(locked)
        if locked.state != AttemptState.RUNNING or not limit or since is None or since > now - timedelta(minutes=limit):
            return locked
        _begin_stopping(locked, reason=StopReason.LEFT, now=now)
    logger.info("attempt %s stopped: no page had it open for %s minutes", locked.id, limit)
    return locked


def attempt_expire(*, attempt: Attempt) -> Attempt:
    """Stop the running attempt if its time is up and was not extended meanwhile (reason ``expired``)."""
    now = timezone.now()
    with transaction.atomic():
        locked = Attempt.objects.select_for_update().get(pk=attempt.pk)
        if locked.state != AttemptState.RUNNING or locked.expires_at is None or locked.expires_at > now:
            return locked
        _begin_stopping(locked, reason=StopReason.EXPIRED, now=now)
    return locked
