"""Reads of grading runs: one run for a user who may see it, and the JSON payload pushed to browsers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils.translation import gettext as _

from grading.models import CheckResult, GradingRun
from labs.access import attempts_visible_to
from portal.errors import NotFound
from portal.models import User


def run_get_for_user(*, user: User, run_id: int) -> GradingRun:
    run = (
        GradingRun.objects.filter(id=run_id, attempt__in=attempts_visible_to(user=user))
        .select_related("attempt")
        .prefetch_related("results")
        .first()
    )
    if run is None:
        raise NotFound(_("Grading run not found."))
    return run


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _number(value: Decimal | None) -> float | None:
    return float(value) if value is not None else None


def grading_run_payload(run: GradingRun, *, results: Sequence[CheckResult] | None = None) -> dict[str, Any]:
    """A JSON-safe view of a run for the attempt's page: feedback, never command output (students never see it)."""
    results = sorted(run.results.all() if results is None else results, key=lambda r: (r.order, r.pk or 0))
    return {
        "id": run.pk,
        "attempt_id": run.attempt_id,
        "state": run.state,
        "state_label": str(run.get_state_display()),
        "trigger": run.trigger,
        "finished": run.is_finished,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "score": _number(run.score),
        "max_score": _number(run.max_score),
        "late_penalty_percent": _number(run.late_penalty_percent),
        "effective_score": _number(run.effective_score),
        "error_code": run.error_code,
        "error": run.error_message,
        "results": [
            {
                "check_id": r.check_ref_id,
                "title": r.check_title,
                "order": r.order,
                "passed": r.passed,
                "points": _number(r.points),
                "max_points": _number(r.max_points),
                "timed_out": r.timed_out,
                "feedback": r.feedback_text,
            }
            for r in results
        ],
    }
