"""The live class view of a lab for its staff: every attempt in progress with its time left, its latest Check and
the checks still failing, and who looks stuck. A fixed number of queries whatever the class's size."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Prefetch
from django.utils import timezone

from grading.models import CheckResult, GradingRun, RunState
from labs.models import ACTIVE_STATES, Attempt, AttemptState, Lab

# No better score for this long (or no Check at all this long after the VM was ready) counts as stuck.
STUCK_AFTER = timedelta(minutes=15)
# The same check failing in this many runs in a row counts as stuck on it.
SAME_FAILURE_RUNS = 3


@dataclass
class ClassRow:
    attempt: Attempt
    latest: GradingRun | None = None
    failing: list[str] = field(default_factory=list)  # titles of the checks the latest run failed
    stuck_on: str = ""  # a check failed again and again
    idle_minutes: int = 0  # minutes without a better score (0: not stuck that way)

    @property
    def seconds_left(self) -> int | None:
        if self.attempt.expires_at is None:
            return None
        return max(0, int((self.attempt.expires_at - timezone.now()).total_seconds()))

    @property
    def stuck(self) -> bool:
        return bool(self.stuck_on or self.idle_minutes)


def _idle_since(attempt: Attempt, runs: list[GradingRun]) -> datetime | None:
    """When the attempt last got a better score (or its VM became ready, before any Check); None when done."""
    if runs and runs[-1].max_score and runs[-1].score == runs[-1].max_score:
        return None
    since, best = attempt.agent_ready_at or attempt.requested_at, None
    for run in runs:
        if run.score is not None and (best is None or run.score > best):
            best, since = run.score, run.created_at
    return since


def class_view(*, lab: Lab) -> list[ClassRow]:
    """The lab's attempts in progress, by student name. Callers have checked the user is the lab's staff."""
    now = timezone.now()
    attempts = list(
        Attempt.objects.filter(lab=lab, tenant_id=lab.course.tenant_id, state__in=ACTIVE_STATES)
        .select_related("student")
        .prefetch_related(
            Prefetch(
                "runs",
                to_attr="done_runs",
                queryset=GradingRun.objects.filter(state=RunState.DONE)
                .order_by("created_at", "id")
                .prefetch_related(Prefetch("results", queryset=CheckResult.objects.order_by("order", "id"))),
            )
        )
        .order_by("student__full_name", "student__username")
    )
    rows = []
    for attempt in attempts:
        runs = attempt.done_runs
        row = ClassRow(attempt=attempt, latest=runs[-1] if runs else None)
        if row.latest is not None:
            row.failing = [r.check_title for r in row.latest.results.all() if not r.passed]
            recent = runs[-SAME_FAILURE_RUNS:]
            if len(recent) == SAME_FAILURE_RUNS:
                failed_each = [{r.check_title for r in run.results.all() if not r.passed} for run in recent]
                again = set.intersection(*failed_each)
                row.stuck_on = min(again, key=row.failing.index) if again else ""
        since = _idle_since(attempt, runs) if attempt.state == AttemptState.RUNNING else None
        if since is not None and now - since >= STUCK_AFTER:
            row.idle_minutes = int((now - since).total_seconds() // 60)
        rows.append(row)
    return rows
