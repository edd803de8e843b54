"""Reads of one attempt or of one student's attempts at a lab, for course staff: the student in their course, the
attempts with their runs counted, an attempt's timeline, runs and grade. Callers have checked access to the lab."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Field, Prefetch, Q, QuerySet
from django.utils.translation import gettext as _

from grading.models import CheckResult, Grade, GradingRun, RunState
from labs.models import Attempt, Lab
from labs.selectors import PHASE_FIELDS
from portal.errors import NotFound
from portal.models import Course, Membership, Role, User


def course_student_get(*, course: Course, student_id: int) -> User:
    """A student enrolled in the course (staff pages address students only through their course)."""
    membership = (
        Membership.objects.filter(course=course, user_id=student_id, role=Role.STUDENT, user__tenant=course.tenant)
        .select_related("user")
        .first()
    )
    if membership is None:
        raise NotFound(_("Student not found."))
    return membership.user


def attempts_with_run_counts(attempts: QuerySet[Attempt]) -> QuerySet[Attempt]:
    """The attempts, each annotated with ``runs_done`` (runs scored) and ``runs_error`` (runs that failed)."""
    return attempts.annotate(
        runs_done=Count("runs", filter=Q(runs__state=RunState.DONE)),
        runs_error=Count("runs", filter=Q(runs__state=RunState.ERROR)),
    )


def student_lab_attempts(*, lab: Lab, student: User) -> list[Attempt]:
    """The student's attempts at the lab, newest first, with their run counts (the tenant matched too)."""
    if student.tenant_id is None:
        return []
    return list(
        attempts_with_run_counts(
            Attempt.objects.filter(lab=lab, student=student, tenant_id=student.tenant_id)
        ).order_by("-requested_at", "-id")
    )


@dataclass(frozen=True)
class TimelineEntry:
    label: str
    at: datetime


def _field_label(name: str) -> str:
    field = Attempt._meta.get_field(name)
    return str(field.verbose_name) if isinstance(field, Field) else name


def attempt_timeline(attempt: Attempt) -> list[TimelineEntry]:
    """The attempt's phases in time order, compared by the second (the cluster's times are whole seconds); the sort
    is stable, so phases within one second keep their lifecycle order."""
    entries = [
        TimelineEntry(label=_field_label(name), at=getattr(attempt, name))
        for name in PHASE_FIELDS
        if getattr(attempt, name) is not None
    ]
    return sorted(entries, key=lambda entry: entry.at.replace(microsecond=0))


@dataclass
class AttemptDetail:
    attempt: Attempt
    timeline: list[TimelineEntry]
    runs: list[GradingRun]
    grade: Grade | None


def runs_with_results(queryset) -> list[GradingRun]:
    """The runs, newest first, with their results, ``number`` among their attempt's runs and ``regrade_of_number``."""
    runs = list(
        queryset.select_related("requested_by")
        .prefetch_related(Prefetch("results", queryset=CheckResult.objects.order_by("order", "id")))
        .order_by("-created_at", "-id")
    )
    counts: Counter[int] = Counter()
    for run in reversed(runs):  # oldest first
        counts[run.attempt_id] += 1
        run.number = counts[run.attempt_id]
    numbers = {run.pk: run.number for run in runs}
    for run in runs:
        run.regrade_of_number = numbers.get(run.regrade_of_id)
    return runs


def attempt_detail(*, attempt: Attempt) -> AttemptDetail:
    return AttemptDetail(
        attempt=attempt,
        timeline=attempt_timeline(attempt),
        runs=runs_with_results(GradingRun.objects.filter(attempt=attempt)),
        grade=Grade.objects.filter(lab_id=attempt.lab_id, student_id=attempt.student_id).first(),
    )
