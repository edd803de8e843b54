"""Grading runs (``queued → running → done | error``): queueing, the Celery execution, clean-up of stuck runs, and
the ``grading.update`` pushes to the attempt's page. Only a ``done`` run counts towards a grade; one that could not
reach the agent ends ``error`` with a reason."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from grading.evaluation import evaluate_check, late_penalty_percent
from grading.models import CheckResult, GradingRun, RunState
from labs import agent_client
from labs.models import Attempt, AttemptState, Check
from labs.services.events import CLASS_CHANGED_HOLD_SECONDS, attempt_group, lab_class_group, send_to_group
from portal.errors import Conflict
from portal.models import User

logger = logging.getLogger(__name__)

UNFINISHED_STATES = (RunState.QUEUED, RunState.RUNNING)
# Beyond a running run's own deadline, before it is taken for a run whose worker died.
RUNNING_STALE_SLACK_SECONDS = 60

# Stable error codes stored on failed runs (``GradingRun.error_code``); ``GradingRun.error_message`` words them.
ERROR_ATTEMPT_NOT_RUNNING = "attempt_not_running"
ERROR_NO_CHECKS = "no_checks"
ERROR_STALE = "interrupted"
ERROR_REPLACED = "replaced_by_final_run"
ERROR_INTERNAL = "internal_error"
ERROR_TIME_LIMIT = "time_limit"
ERROR_QUEUE_UNAVAILABLE = "queue_unavailable"


def lab_checks(*, attempt: Attempt) -> list[Check]:
    return list(Check.objects.filter(lab_id=attempt.lab_id).order_by("order", "id"))


def create_unfinished_run(*, attempt: Attempt, state: str, trigger: str, requested_by: User | None) -> GradingRun:
    try:
        with transaction.atomic():
            return GradingRun.objects.create(
                attempt=attempt,
                state=state,
                trigger=trigger,
                requested_by=requested_by,
                started_at=timezone.now() if state == RunState.RUNNING else None,
            )
    except IntegrityError:
        # grading_one_unfinished_run_per_attempt: another run slipped in (e.g. a final run without the lock).
        raise Conflict(_("A check of this attempt is already in progress."), code="run_in_progress") from None


def push_run_on_commit(*, run: GradingRun, results: Sequence[CheckResult] | None = None) -> None:
    """After commit, send the run's payload in every language (``runs``, and ``run`` in the default one) to
    ``attempt-<id>``; ``results`` saves reading them when the caller holds them."""
    run_id, attempt_id, lab_id = run.pk, run.attempt_id, run.attempt.lab_id

    def push() -> None:
        from grading.selectors import grading_run_payload

        try:
            if results is None:
                fresh = GradingRun.objects.filter(pk=run_id).prefetch_related("results").first()
                if fresh is None:
                    return
                source, rows = fresh, None
            else:
                source, rows = run, results
            payloads = {}
            for language, _name in settings.LANGUAGES:
                with translation.override(language):
                    payloads[language] = grading_run_payload(source, results=rows)
            update = {"type": "grading.update", "run": payloads[settings.LANGUAGE_CODE], "runs": payloads}
            send_to_group(attempt_group(attempt_id), update)
        except Exception:
            # The run is stored whatever happens here; the page shows it on its next load.
            logger.warning("grading run %s: could not push the update to attempt-%s", run_id, attempt_id, exc_info=True)
        try:
            # The lab's class views show the last Check's score and what still fails.
            send_to_group(lab_class_group(lab_id), {"type": "class.changed"}, hold=CLASS_CHANGED_HOLD_SECONDS)
        except Exception:
            logger.warning("grading run %s: could not tell the class view", run_id, exc_info=True)

    transaction.on_commit(push)


def enqueue_run_on_commit(*, run: GradingRun, checks: Sequence[Check]) -> None:
    """Send ``grading_run_execute`` after commit, with time limits that fit the checks, and show the queued run."""
    from grading.tasks import grading_run_execute

    deadline = agent_client.deadline_for_checks(checks)
    soft_limit = max(int(deadline) + 30, settings.CELERY_TASK_SOFT_TIME_LIMIT)
    run_id = run.pk

    def send() -> None:
        try:
            grading_run_execute.apply_async(args=[run_id], soft_time_limit=soft_limit, time_limit=soft_limit + 30)
        except Exception as exc:
            # Left queued, the run would block the attempt's checks until the stale-run sweep; end it now instead.
            logger.exception("grading run %s could not be queued", run_id)
            grading_run_fail(
                run=GradingRun(pk=run_id),
                error_code=ERROR_QUEUE_UNAVAILABLE,
                error=f"the task queue refused the run: {type(exc).__name__}: {exc}",
            )

    transaction.on_commit(send)
    push_run_on_commit(run=run, results=[])


def grading_run_execute(*, run_id: int) -> GradingRun | None:
    """Claim a queued run, run the lab's checks in the guest, and record the outcome; None when it was not
    queued any more (a redelivered message)."""
    claimed = GradingRun.objects.filter(id=run_id, state=RunState.QUEUED).update(
        state=RunState.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        logger.info("grading run %s was not queued any more; nothing to do", run_id)
        return None
    run = GradingRun.objects.select_related("attempt__lab").get(id=run_id)
    push_run_on_commit(run=run, results=[])
    attempt = run.attempt
    if attempt.state != AttemptState.RUNNING:
        return grading_run_fail(
            run=run, error_code=ERROR_ATTEMPT_NOT_RUNNING, error=f"attempt is {attempt.state}, not running"
        )
    checks = lab_checks(attempt=attempt)
    if not checks:
        return grading_run_fail(run=run, error_code=ERROR_NO_CHECKS, error="the lab has no checks")
    return measure_and_record(run=run, attempt=attempt, checks=checks)


def measure_and_record(*, run: GradingRun, attempt: Attempt, checks: Sequence[Check]) -> GradingRun:
    """Ask the agent for the checks' results and record them; agent trouble ends the run in ``error``."""
    try:
        results = agent_client.run_checks(attempt, checks)
    except agent_client.AgentError as exc:
        logger.info("grading run %s: %s: %s", run.pk, exc.code, exc.message)
        return grading_run_fail(run=run, error_code=exc.code, error=exc.message)
    except SoftTimeLimitExceeded:
        return grading_run_fail(run=run, error_code=ERROR_TIME_LIMIT, error="the task's time limit was reached")
    except Exception as exc:
        logger.exception("grading run %s failed", run.pk)
        grading_run_fail(run=run, error_code=ERROR_INTERNAL, error=f"{type(exc).__name__}: {exc}")
        raise
    return grading_run_record(run=run, checks=checks, results=results, measured_at=run.started_at or timezone.now())


def check_results_create(
    *, run: GradingRun, checks: Sequence[Check], results: Sequence[dict[str, Any]]
) -> list[CheckResult]:
    """Evaluate each check's agent-shaped result and store it; the run's score and maximum are set, not saved."""
    rows: list[CheckResult] = []
    run.score, run.max_score = Decimal(0), Decimal(0)
    for check, result in zip(checks, results, strict=True):
        verdict = evaluate_check(check=check, result=result)
        run.score += verdict.points
        run.max_score += verdict.max_points
        rows.append(
            CheckResult(
                run=run,
                check_ref=check,
                check_title=check.title,
                order=check.order,
                passed=verdict.passed,
                points=verdict.points,
                max_points=verdict.max_points,
                exit_code=result.get("exit_code"),
                timed_out=bool(result.get("timed_out")),
                stdout=result.get("stdout") or "",
                stderr=result.get("stderr") or "",
                output_truncated=bool(result.get("stdout_truncated") or result.get("stderr_truncated")),
                duration_ms=max(0, int(result.get("duration_ms") or 0)),
                feedback=verdict.feedback,
                pattern_timeout_seconds=verdict.pattern_timeout_seconds,
            )
        )
    CheckResult.objects.bulk_create(rows)
    return rows


@transaction.atomic
def grading_run_record(
    *, run: GradingRun, checks: Sequence[Check], results: Sequence[dict[str, Any]], measured_at
) -> GradingRun:
    """Store the agent's results, finish the run and recompute the grade; a run no longer ``running`` (failed as
    stale meanwhile) keeps its state and the late results are dropped."""
    from grading.services.grades import grade_recompute

    run = GradingRun.objects.select_for_update(of=("self",)).select_related("attempt__lab").get(pk=run.pk)
    if run.state != RunState.RUNNING:
        logger.warning("grading run %s is %s; late results discarded", run.pk, run.state)
        return run
    lab = run.attempt.lab
    rows = check_results_create(run=run, checks=checks, results=results)
    run.state = RunState.DONE
    run.finished_at = timezone.now()
    run.measured_at = measured_at
    run.late_penalty_percent = late_penalty_percent(lab, measured_at=measured_at)
    run.save(update_fields=["state", "finished_at", "measured_at", "score", "max_score", "late_penalty_percent"])
    grade_recompute(lab=lab, student_id=run.attempt.student_id)
    push_run_on_commit(run=run, results=rows)
    return run


@transaction.atomic
def grading_run_fail(*, run: GradingRun, error_code: str, error: str) -> GradingRun:
    """End an unfinished run in ``error`` (no score). A run already finished is left as it is."""
    updated = GradingRun.objects.filter(pk=run.pk, state__in=UNFINISHED_STATES).update(
        state=RunState.ERROR, finished_at=timezone.now(), error_code=error_code, error=error[:2000]
    )
    run.refresh_from_db()
    if updated:
        push_run_on_commit(run=run, results=[])
    return run


def grading_runs_fail_stale(*, attempt: Attempt | None = None) -> int:
    """Fail runs whose worker never came or died: queued too long, or running past their deadline."""
    now = timezone.now()
    runs = GradingRun.objects.filter(state__in=UNFINISHED_STATES).select_related("attempt")
    if attempt is not None:
        runs = runs.filter(attempt=attempt)
    failed = 0
    deadlines: dict[int, float] = {}
    for run in runs:
        if run.state == RunState.QUEUED:
            stale = run.created_at < now - timedelta(seconds=settings.GRADING_QUEUED_STALE_SECONDS)
        else:
            lab_id = run.attempt.lab_id
            if lab_id not in deadlines:
                deadlines[lab_id] = agent_client.deadline_for_checks(lab_checks(attempt=run.attempt))
            limit = deadlines[lab_id] + RUNNING_STALE_SLACK_SECONDS
            stale = (run.started_at or run.created_at) < now - timedelta(seconds=limit)
        if stale:
            grading_run_fail(run=run, error_code=ERROR_STALE, error=f"the run was still {run.state} at {now:%c}")
            failed += 1
    return failed
