"""Regrades: an attempt's counted runs evaluated again against the lab's current checks, and the lab-wide regrade,
queued as a ``LabRegrade`` and carried out by a Celery task in one transaction on its locked row."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from grading.evaluation import late_penalty_percent
from grading.models import GradingRun, LabRegrade, RunState, RunTrigger
from grading.services.grades import _require_course_staff, counted_runs, grade_recompute
from grading.services.runs import (
    UNFINISHED_STATES,
    check_results_create,
    enqueue_run_on_commit,
    lab_checks,
    push_run_on_commit,
)
from labs.models import Attempt, AttemptState, Check, Lab
from portal.errors import ApplicationError, NotFound, PermissionDenied
from portal.models import STAFF_ROLES, User
from portal.selectors import course_role
from portal.services import audit_record

logger = logging.getLogger(__name__)


@dataclass
class RegradeOutcome:
    reevaluated: list[GradingRun] = field(default_factory=list)
    queued: GradingRun | None = None
    # True when the attempt is running but a run was already in progress, so no new guest run was queued.
    guest_run_skipped: bool = False


def _reevaluate_run(*, actor: User, original: GradingRun, checks: Sequence[Check], lab: Lab) -> GradingRun:
    """A new ``done`` run scoring ``original``'s stored outputs against the current checks."""
    measured_at = original.measured_at or original.started_at or original.created_at
    now = timezone.now()
    regrade = GradingRun.objects.create(
        attempt_id=original.attempt_id,
        state=RunState.DONE,
        trigger=RunTrigger.REGRADE,
        requested_by=actor,
        regrade_of=original,
        started_at=now,
        finished_at=now,
        measured_at=measured_at,
        late_penalty_percent=late_penalty_percent(lab, measured_at=measured_at),
    )
    stored = {r.check_ref_id: r for r in original.results.all() if r.check_ref_id is not None}
    # A check added after the original run has no output to judge: it fails, as it would have then.
    results = [
        {
            "exit_code": old.exit_code,
            "stdout": old.stdout,
            "stderr": old.stderr,
            "timed_out": old.timed_out,
            "stdout_truncated": old.output_truncated,
            "duration_ms": old.duration_ms,
        }
        if (old := stored.get(check.pk)) is not None
        else {"exit_code": None}
        for check in checks
    ]
    rows = check_results_create(run=regrade, checks=checks, results=results)
    regrade.save(update_fields=["score", "max_score"])
    push_run_on_commit(run=regrade, results=rows)
    return regrade


def _regrade_attempt(*, actor: User, attempt: Attempt, checks: Sequence[Check]) -> RegradeOutcome:
    outcome = RegradeOutcome()
    for original in counted_runs(attempt=attempt).prefetch_related("results").order_by("created_at", "id"):
        outcome.reevaluated.append(_reevaluate_run(actor=actor, original=original, checks=checks, lab=attempt.lab))
    if attempt.state == AttemptState.RUNNING and checks:
        if GradingRun.objects.filter(attempt=attempt, state__in=UNFINISHED_STATES).exists():
            outcome.guest_run_skipped = True
        else:
            run = GradingRun.objects.create(
                attempt=attempt, state=RunState.QUEUED, trigger=RunTrigger.REGRADE, requested_by=actor
            )
            enqueue_run_on_commit(run=run, checks=checks)
            outcome.queued = run
    return outcome


@transaction.atomic
def grading_regrade(*, actor: User, attempt: Attempt) -> RegradeOutcome:
    """Re-evaluate the attempt's counted runs against the current checks and, while it runs, check it again."""
    attempt = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course__tenant").get(pk=attempt.pk)
    lab = attempt.lab
    if course_role(user=actor, course=lab.course) not in STAFF_ROLES:
        if attempt.student_id == actor.pk:
            raise PermissionDenied(_("Only course staff can regrade."))
        raise NotFound(_("Attempt not found."))
    checks = lab_checks(attempt=attempt)
    outcome = _regrade_attempt(actor=actor, attempt=attempt, checks=checks)
    grade_recompute(lab=lab, student_id=attempt.student_id)
    audit_record(
        actor=actor,
        action="grading.regraded",
        target=attempt,
        tenant=lab.course.tenant,
        course=lab.course,
        data={
            "attempt_id": attempt.pk,
            "reevaluated_runs": [r.regrade_of_id for r in outcome.reevaluated],
            "new_runs": [r.pk for r in outcome.reevaluated],
            "queued_run": outcome.queued.pk if outcome.queued else None,
        },
    )
    return outcome


@dataclass
class LabRegradeOutcome:
    attempts: int = 0
    reevaluated: int = 0
    queued: int = 0
    students: set[int] = field(default_factory=set)


@transaction.atomic
def grading_regrade_lab(*, actor: User, lab: Lab) -> LabRegradeOutcome:
    """Regrade every attempt at the lab (see :func:`grading_regrade`), e.g. after an instructor fixed a check."""
    _require_course_staff(actor=actor, lab=lab)
    checks = list(Check.objects.filter(lab=lab).order_by("order", "id"))
    outcome = LabRegradeOutcome()
    attempts = Attempt.objects.select_for_update(of=("self",)).filter(lab=lab).select_related("lab").order_by("id")
    for attempt in attempts:
        result = _regrade_attempt(actor=actor, attempt=attempt, checks=checks)
        if result.reevaluated or result.queued:
            outcome.attempts += 1
        outcome.reevaluated += len(result.reevaluated)
        outcome.queued += 1 if result.queued else 0
        outcome.students.add(attempt.student_id)
    for student_id in sorted(outcome.students):
        grade_recompute(lab=lab, student_id=student_id)
    audit_record(
        actor=actor,
        action="grading.lab_regraded",
        target=lab,
        tenant=lab.course.tenant,
        course=lab.course,
        data={
            "lab_id": lab.pk,
            "attempts": outcome.attempts,
            "reevaluated_runs": outcome.reevaluated,
            "queued_runs": outcome.queued,
        },
    )
    return outcome


# A regrade still queued after this long lost its task message (broker restarted, worker gone for good); twice
# the task's hard time limit, so one being carried out (its row locked) or waiting behind another is left alone.
QUEUED_STALE_SECONDS = max(settings.GRADING_QUEUED_STALE_SECONDS, 2 * settings.CELERY_TASK_TIME_LIMIT)


@transaction.atomic
def lab_regrade_request(*, actor: User, lab: Lab) -> tuple[LabRegrade, bool]:
    """Queue a regrade of every attempt at the lab (course staff; audited); returns it and whether it is new, since
    one still queued is returned as it is."""
    _require_course_staff(actor=actor, lab=lab)
    Lab.objects.select_for_update().filter(pk=lab.pk).first()  # one queued regrade per lab, even on a double click
    lab_regrades_fail_stale(lab=lab)
    pending = LabRegrade.objects.filter(lab=lab, state=RunState.QUEUED).order_by("created_at", "id").first()
    if pending is not None:
        return pending, False
    # The attempts it works on: those with a scored run, and those still running.
    attempts = Attempt.objects.filter(Q(runs__state=RunState.DONE) | Q(state=AttemptState.RUNNING), lab=lab)
    regrade = LabRegrade.objects.create(lab=lab, requested_by=actor, attempts_requested=attempts.distinct().count())
    audit_record(
        actor=actor,
        action="grading.lab_regrade_queued",
        target=lab,
        tenant=lab.course.tenant,
        course=lab.course,
        data={"lab_id": lab.pk, "lab_regrade_id": regrade.pk, "attempts": regrade.attempts_requested},
    )
    from grading.tasks import lab_regrade_execute as task

    def send() -> None:
        try:
            task.delay(regrade.pk)
        except Exception as exc:
            logger.exception("lab regrade %s could not be queued", regrade.pk)
            _fail(regrade_id=regrade.pk, error=f"the task queue refused the regrade: {type(exc).__name__}: {exc}")

    transaction.on_commit(send)
    return regrade, True


def lab_regrade_execute(*, regrade_id: int) -> LabRegrade | None:
    """Carry out a queued regrade. Returns None when it is not queued any more (done, failed, or gone)."""
    try:
        with transaction.atomic():
            regrade = (
                LabRegrade.objects.select_for_update(of=("self",))
                .select_related("lab__course__tenant", "requested_by")
                .filter(pk=regrade_id, state=RunState.QUEUED)
                .first()
            )
            if regrade is None:
                return None
            actor = regrade.requested_by
            if actor is None or course_role(user=actor, course=regrade.lab.course) not in STAFF_ROLES:
                raise ApplicationError("the person who asked for the regrade is no longer course staff")
            outcome = grading_regrade_lab(actor=actor, lab=regrade.lab)
            regrade.state = RunState.DONE
            regrade.attempts_regraded = outcome.attempts
            regrade.runs_reevaluated = outcome.reevaluated
            regrade.runs_queued = outcome.queued
            regrade.finished_at = timezone.now()
            regrade.save(update_fields=["state", "attempts_regraded", "runs_reevaluated", "runs_queued", "finished_at"])
            return regrade
    except ApplicationError as exc:  # e.g. the requester is no longer course staff
        return _fail(regrade_id=regrade_id, error=exc.message)
    except SoftTimeLimitExceeded:
        return _fail(regrade_id=regrade_id, error="the task's time limit was reached; nothing was changed")
    except Exception as exc:
        logger.exception("lab regrade %s failed", regrade_id)
        _fail(regrade_id=regrade_id, error=f"{type(exc).__name__}: {exc}; nothing was changed")
        raise


def _fail(*, regrade_id: int, error: str) -> LabRegrade | None:
    LabRegrade.objects.filter(pk=regrade_id, state=RunState.QUEUED).update(
        state=RunState.ERROR, error=error[:2000], finished_at=timezone.now()
    )
    return LabRegrade.objects.filter(pk=regrade_id).first()


def lab_regrades_fail_stale(*, lab: Lab | None = None, now=None) -> int:
    """Fail regrades queued so long that their task message was lost, so a new one can be asked for."""
    now = now or timezone.now()
    stale = LabRegrade.objects.filter(
        state=RunState.QUEUED, created_at__lt=now - timedelta(seconds=QUEUED_STALE_SECONDS)
    )
    if lab is not None:
        stale = stale.filter(lab=lab)
    return stale.update(state=RunState.ERROR, error="the regrade was never carried out", finished_at=now)
