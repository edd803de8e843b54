"""The Check button: a grading run queued for a running attempt, at most one at a time and not too often."""

from __future__ import annotations

import math

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from grading.models import GradingRun, RunState, RunTrigger
from grading.services.runs import (
    ERROR_ATTEMPT_NOT_RUNNING,
    ERROR_NO_CHECKS,
    ERROR_QUEUE_UNAVAILABLE,
    UNFINISHED_STATES,
    create_unfinished_run,
    enqueue_run_on_commit,
    grading_runs_fail_stale,
    lab_checks,
)
from labs.models import Attempt, AttemptState
from portal.errors import ApplicationError, Conflict, NotFound, Unavailable
from portal.models import STAFF_ROLES, User
from portal.selectors import course_role
from portal.services import audit_record


def grading_run_request(*, actor: User, attempt: Attempt) -> GradingRun:
    """Queue a grading run for a running attempt (the student's Check button, or staff doing the same); the
    Celery task is sent on commit, and a queue that does not answer is a 503 once committed."""
    run = _grading_run_queue(actor=actor, attempt=attempt)
    if not transaction.get_connection().in_atomic_block:
        # Committed, and the task handed to the broker (or not) on that commit.
        run.refresh_from_db()
        if run.state == RunState.ERROR and run.error_code == ERROR_QUEUE_UNAVAILABLE:
            raise Unavailable(
                _("Your check could not be queued: the portal's task queue is not answering. Try again in a minute."),
                code=ERROR_QUEUE_UNAVAILABLE,
                retry_after=30,
            )
    return run


@transaction.atomic
def _grading_run_queue(*, actor: User, attempt: Attempt) -> GradingRun:
    # Locking the attempt row (only it: the lab's and course's would hold up classmates) serialises presses.
    attempt = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
    course = attempt.lab.course
    is_owner = attempt.student_id == actor.pk
    if not is_owner and course_role(user=actor, course=course) not in STAFF_ROLES:
        raise NotFound(_("Attempt not found."))
    if attempt.state != AttemptState.RUNNING:
        raise Conflict(
            _("Your lab's virtual machine is not running, so it cannot be checked."), code=ERROR_ATTEMPT_NOT_RUNNING
        )
    checks = lab_checks(attempt=attempt)
    if not checks:
        raise ApplicationError(_("This lab has no checks to run."), code=ERROR_NO_CHECKS)
    grading_runs_fail_stale(attempt=attempt)
    unfinished = GradingRun.objects.filter(attempt=attempt, state__in=UNFINISHED_STATES).first()
    if unfinished is not None:
        raise Conflict(
            _("A check of this attempt is already in progress."),
            code="run_in_progress",
            extra={"run_id": unfinished.pk},
        )
    # A run the queue refused never reached the guest: it does not hold the next press back.
    previous = (
        GradingRun.objects.filter(attempt=attempt)
        .exclude(error_code=ERROR_QUEUE_UNAVAILABLE)
        .order_by("-created_at", "-id")
        .first()
    )
    if previous is not None:
        wait = settings.GRADING_MIN_INTERVAL_SECONDS - (timezone.now() - previous.created_at).total_seconds()
        if wait > 0:
            seconds = math.ceil(wait)
            raise ApplicationError(
                _("Please wait %(seconds)d seconds before checking again.") % {"seconds": seconds},
                code="too_soon",
                status_code=429,
                retry_after=seconds,
            )
    run = create_unfinished_run(
        attempt=attempt,
        state=RunState.QUEUED,
        trigger=RunTrigger.STUDENT if is_owner else RunTrigger.STAFF,
        requested_by=actor,
    )
    audit_record(
        actor=actor,
        action="grading.run_requested",
        target=run,
        tenant=attempt.tenant,
        course=course,
        data={"attempt_id": attempt.pk, "run_id": run.pk, "trigger": run.trigger},
    )
    enqueue_run_on_commit(run=run, checks=checks)
    return run
