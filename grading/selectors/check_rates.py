"""How the class fares on each check of a lab: of each student's latest scored run, the share that passed it (the
step a class struggles with shows as the shortest bar on the lab report)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q

from grading.models import CheckResult, GradingRun, RunState
from labs.models import Lab


@dataclass(frozen=True)
class CheckPassRate:
    order: int
    title: str
    passed: int
    total: int

    @property
    def percent(self) -> int:
        return round(self.passed * 100 / self.total) if self.total else 0


def check_pass_rates(*, lab: Lab, student_ids: set[int]) -> list[CheckPassRate]:
    """Per check, in the lab's order: how many of the given students passed it in their latest scored run, of those
    whose latest run ran it. Two queries whatever the class's size."""
    latest: dict[int, int] = {}
    runs = (
        GradingRun.objects.filter(attempt__lab=lab, state=RunState.DONE, attempt__student_id__in=student_ids)
        .order_by("created_at", "id")
        .values_list("attempt__student_id", "id")
    )
    for student_id, run_id in runs:
        latest[student_id] = run_id  # the later run wins
    rows = (
        CheckResult.objects.filter(run_id__in=latest.values())
        .values("order", "check_title")
        .annotate(passed=Count("id", filter=Q(passed=True)), total=Count("id"))
        .order_by("order", "check_title")
    )
    return [
        CheckPassRate(order=row["order"], title=row["check_title"], passed=row["passed"], total=row["total"])
        for row in rows
    ]
