"""Grades: recomputation from runs by the lab's policy, instructor overrides, and regrades after a check changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from grading.evaluation import ScoredRun, choose_run, earns_credit, evaluate_check, late_penalty_percent
from grading.models import CheckResult, Grade, GradingRun, RunState, RunTrigger
from grading.services.push import push_run_on_commit
from grading.services.runs import UNFINISHED_STATES, enqueue_run_on_commit, lab_checks
from labs.models import Attempt, AttemptState, Check, Lab
from portal.errors import ApplicationError, NotFound, PermissionDenied
from portal.models import STAFF_ROLES, Membership, Role, User
from portal.selectors import course_role
from portal.services import audit_record

MAX_REASON_CHARS = 2000


def lab_max_points(*, lab: Lab) -> Decimal:
    return Check.objects.filter(lab=lab).aggregate(total=Sum("points"))["total"] or Decimal(0)


def counted_runs(*, lab: Lab, student_id: int):
    """Finished runs of all the student's attempts at the lab that a grade may count: ``done``, and not
    superseded by a regrade of their outputs."""
    return GradingRun.objects.filter(attempt__lab=lab, attempt__student_id=student_id, state=RunState.DONE).exclude(
        regrades__state=RunState.DONE
    )


def grade_recompute(*, lab: Lab, student_id: int) -> Grade:
    """Derive the student's grade for the lab from their runs (the override, if any, is kept and still wins)."""
    candidates = []
    for row in counted_runs(lab=lab, student_id=student_id).values(
        "id", "score", "max_score", "late_penalty_percent", "measured_at"
    ):
        if row["measured_at"] is None or row["score"] is None:
            continue
        if not earns_credit(lab, measured_at=row["measured_at"]):
            continue
        candidates.append(
            (
                ScoredRun(
                    run_id=row["id"],
                    score=row["score"],
                    penalty_percent=row["late_penalty_percent"],
                    measured_at=row["measured_at"],
                ),
                row["max_score"],
            )
        )
    chosen = choose_run(policy=lab.grade_policy, runs=[c[0] for c in candidates])
    grade, _created = Grade.objects.select_for_update().get_or_create(lab=lab, student_id=student_id)
    if chosen is None:
        grade.score = None
        grade.max_score = lab_max_points(lab=lab)
        grade.late = False
        grade.source_run_id = None
    else:
        grade.score = chosen.effective_score
        grade.max_score = next(m for r, m in candidates if r is chosen)
        grade.late = lab.due_at is not None and chosen.measured_at > lab.due_at
        grade.source_run_id = chosen.run_id
    grade.save(update_fields=["score", "max_score", "late", "source_run", "updated_at"])
    return grade


def _require_course_staff(*, actor: User, lab: Lab) -> str:
    role = course_role(user=actor, course=lab.course)
    if role not in STAFF_ROLES:
        raise NotFound(_("Lab not found."))
    return role


# ---------------------------------------------------------------------------------------------------------------
# Overrides


def parse_override_score(value: str | Decimal | None) -> Decimal | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        score = Decimal(str(value).strip())
    except InvalidOperation:
        raise ApplicationError(_("The score must be a number.")) from None
    if not score.is_finite():
        raise ApplicationError(_("The score must be a number."))
    return score


@transaction.atomic
def grade_override(*, actor: User, lab: Lab, student: User, score: Decimal | None, reason: str) -> Grade:
    """Set (or, with ``score=None``, remove) a staff override of the student's grade. A reason is required; the
    change is audited with the old and new values. The override wins over any run until removed."""
    _require_course_staff(actor=actor, lab=lab)
    if not Membership.objects.filter(user=student, course=lab.course, role=Role.STUDENT).exists():
        raise NotFound(_("Student not found."))
    reason = (reason or "").strip()
    if not reason:
        raise ApplicationError(_("Give a reason for the override."), code="reason_required")
    if len(reason) > MAX_REASON_CHARS:
        raise ApplicationError(_("The reason is too long (at most %(max)d characters).") % {"max": MAX_REASON_CHARS})
    maximum = lab_max_points(lab=lab)
    if score is not None:
        if score < 0:
            raise ApplicationError(_("The score cannot be negative."), code="invalid_score")
        if score > maximum:
            raise ApplicationError(
                _("The score cannot exceed the lab's %(max)s points.") % {"max": maximum}, code="invalid_score"
            )
        score = score.quantize(Decimal("0.01"))
    grade, created = Grade.objects.select_for_update().get_or_create(
        lab=lab, student=student, defaults={"max_score": maximum}
    )
    if created:
        grade = grade_recompute(lab=lab, student_id=student.pk)
    previous = grade.override_score
    if score is None and previous is None:
        raise ApplicationError(_("This grade has no override to remove."), code="no_override")
    grade.override_score = score
    grade.override_reason = reason if score is not None else ""
    grade.overridden_by = actor if score is not None else None
    grade.overridden_at = timezone.now() if score is not None else None
    grade.save(update_fields=["override_score", "override_reason", "overridden_by", "overridden_at", "updated_at"])
    audit_record(
        actor=actor,
        action="grading.override_set" if score is not None else "grading.override_removed",
        target=grade,
        tenant=lab.course.tenant,
        course=lab.course,
        data={
            "lab_id": lab.pk,
            "student_id": student.pk,
            "reason": reason,
            "previous": None if previous is None else str(previous),
            "override": None if score is None else str(score),
            "computed": None if grade.score is None else str(grade.score),
        },
    )
    return grade


# ---------------------------------------------------------------------------------------------------------------
# Regrades


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
    rows, score, max_score = [], Decimal(0), Decimal(0)
    for check in checks:
        old = stored.get(check.pk)
        result: dict[str, Any] = (
            {"exit_code": old.exit_code, "stdout": old.stdout, "stderr": old.stderr, "timed_out": old.timed_out}
            if old is not None
            # A check added after the original run has no output to judge: it fails, as it would have then.
            else {"exit_code": None, "stdout": "", "stderr": "", "timed_out": False}
        )
        verdict = evaluate_check(check=check, result=result)
        score += verdict.points
        max_score += verdict.max_points
        rows.append(
            CheckResult(
                run=regrade,
                check_ref=check,
                check_title=check.title,
                order=check.order,
                passed=verdict.passed,
                points=verdict.points,
                max_points=verdict.max_points,
                exit_code=result["exit_code"],
                timed_out=result["timed_out"],
                stdout=result["stdout"],
                stderr=result["stderr"],
                output_truncated=old.output_truncated if old is not None else False,
                duration_ms=old.duration_ms if old is not None else 0,
                feedback=verdict.feedback,
                pattern_timeout_seconds=verdict.pattern_timeout_seconds,
            )
        )
    CheckResult.objects.bulk_create(rows)
    regrade.score = score
    regrade.max_score = max_score
    regrade.save(update_fields=["score", "max_score"])
    push_run_on_commit(run=regrade, results=rows)
    return regrade


def _regrade_attempt(*, actor: User, attempt: Attempt, checks: Sequence[Check]) -> RegradeOutcome:
    outcome = RegradeOutcome()
    current = (
        GradingRun.objects.filter(attempt=attempt, state=RunState.DONE)
        .exclude(regrades__state=RunState.DONE)
        .prefetch_related("results")
        .order_by("created_at", "id")
    )
    for original in current:
        outcome.reevaluated.append(_reevaluate_run(actor=actor, original=original, checks=checks, lab=attempt.lab))
    if attempt.state == AttemptState.RUNNING and checks:
        if GradingRun.objects.filter(attempt=attempt, state__in=UNFINISHED_STATES).exists():
            outcome.guest_run_skipped = True
        else:
            run = GradingRun.objects.create(
                attempt=attempt, state=RunState.QUEUED, trigger=RunTrigger.REGRADE, requested_by=actor
            )
            enqueue_run_on_commit(run=run, checks=checks)
            push_run_on_commit(run=run, results=[])
            outcome.queued = run
    return outcome


@transaction.atomic
def grading_regrade(*, actor: User, attempt: Attempt) -> RegradeOutcome:
    """Re-evaluate the attempt's stored outputs against the lab's current checks (one new ``regrade`` run per
    counted run), and, while the attempt is still running, queue a fresh run in the guest. Staff only; audited."""
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
