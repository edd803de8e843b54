"""Grades: recomputation from runs by the lab's policy and instructor overrides (regrades: ``regrades``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from grading.evaluation import ScoredRun, choose_run, earns_credit
from grading.models import Grade, GradingRun, RunState
from grading.selectors.reports import lab_max_points
from labs.models import Lab
from portal.errors import ApplicationError, NotFound
from portal.models import STAFF_ROLES, Membership, Role, User
from portal.selectors import course_role
from portal.services import audit_record

MAX_REASON_CHARS = 2000


def counted_runs(**filters: Any):
    """The runs (among those ``filters`` select) that a grade may count: ``done`` and not regraded."""
    return GradingRun.objects.filter(state=RunState.DONE, **filters).exclude(regrades__state=RunState.DONE)


def grade_recompute(*, lab: Lab, student_id: int) -> Grade:
    """Derive the student's grade for the lab from their runs (the override, if any, is kept and still wins)."""
    rows = counted_runs(
        attempt__lab=lab, attempt__student_id=student_id, measured_at__isnull=False, score__isnull=False
    )
    max_scores, runs = {}, []
    for row in rows.values("id", "score", "max_score", "late_penalty_percent", "measured_at"):
        if earns_credit(lab, measured_at=row["measured_at"]):
            max_scores[row["id"]] = row["max_score"]
            runs.append(
                ScoredRun(
                    run_id=row["id"],
                    score=row["score"],
                    penalty_percent=row["late_penalty_percent"],
                    measured_at=row["measured_at"],
                )
            )
    chosen = choose_run(policy=lab.grade_policy, runs=runs)
    grade, _created = Grade.objects.select_for_update().get_or_create(lab=lab, student_id=student_id)
    if chosen is None:
        grade.score = None
        grade.max_score = lab_max_points(lab=lab)
        grade.late = False
        grade.source_run_id = None
    else:
        grade.score = chosen.effective_score
        grade.max_score = max_scores[chosen.run_id]
        grade.late = lab.due_at is not None and chosen.measured_at > lab.due_at
        grade.source_run_id = chosen.run_id
    grade.save(update_fields=["score", "max_score", "late", "source_run", "updated_at"])
    return grade


def _require_course_staff(*, actor: User, lab: Lab) -> None:
    if course_role(user=actor, course=lab.course) not in STAFF_ROLES:
        raise NotFound(_("Lab not found."))


@transaction.atomic
def grade_override(*, actor: User, lab: Lab, student: User, score: Decimal | None, reason: str) -> Grade:
    """Set (or, with ``score=None``, remove) a staff override of the student's grade, with a reason; audited."""
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
    grade = Grade.objects.select_for_update().filter(lab=lab, student=student).first()
    grade = grade or grade_recompute(lab=lab, student_id=student.pk)
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
