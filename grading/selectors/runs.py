"""Reads of grading runs: one run for a user who may see it, the JSON payload pushed to browsers, and plain-words
messages for run errors."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from grading.evaluation import pattern_timeout_feedback
from grading.models import CheckResult, GradingRun
from labs.access import attempts_visible_to
from portal.errors import NotFound
from portal.models import User

# Messages for GradingRun.error_code, as students and staff read them; the technical detail stays in ``error``.
RUN_ERROR_MESSAGES = {
    "vm_not_running": gettext_lazy("The lab's virtual machine is not running."),
    "attempt_not_running": gettext_lazy("The attempt was not running any more when its checks were due."),
    "agent_not_answering": gettext_lazy(
        "The grading agent in the virtual machine is not answering. Wait a moment and check again."
    ),
    "agent_timeout": gettext_lazy("The checks did not finish in time."),
    "agent_token_rejected": gettext_lazy(
        "The grading agent refused the portal's credentials. Ask your instructor for help."
    ),
    "agent_busy": gettext_lazy("The grading agent is busy. Check again in a few seconds."),
    "agent_bad_response": gettext_lazy("The grading agent gave an answer the portal could not read."),
    "cluster_unavailable": gettext_lazy("The cluster could not be reached. Try again later."),
    "no_checks": gettext_lazy("This lab has no checks to run."),
    "interrupted": gettext_lazy("The check was interrupted before it finished. Check again."),
    "replaced_by_final_run": gettext_lazy("Replaced by the final check when the attempt ended."),
    "time_limit": gettext_lazy("The checks did not finish in time."),
    "internal_error": gettext_lazy("The portal failed while checking. Check again, or ask your instructor."),
    "queue_unavailable": gettext_lazy("The check could not be queued. Try again in a minute."),
}
DEFAULT_FAILURE_FEEDBACK = gettext_lazy("This check did not pass.")


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


def run_error_message(run: GradingRun) -> str:
    if not run.error_code and not run.error:
        return ""
    message = RUN_ERROR_MESSAGES.get(run.error_code)
    return str(message) if message is not None else _("The check could not be completed.")


def result_feedback(result: CheckResult) -> str:
    """What a student reads under a check: nothing on a pass, else the hint, a default, or why it was not judged."""
    if result.passed:
        return ""
    if result.pattern_timeout_seconds is not None:
        return pattern_timeout_feedback(result.pattern_timeout_seconds)
    return result.feedback or str(DEFAULT_FAILURE_FEEDBACK)


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
        "error": run_error_message(run),
        "results": [
            {
                "check_id": r.check_ref_id,
                "title": r.check_title,
                "order": r.order,
                "passed": r.passed,
                "points": _number(r.points),
                "max_points": _number(r.max_points),
                "timed_out": r.timed_out,
                "feedback": result_feedback(r),
            }
            for r in results
        ],
    }
