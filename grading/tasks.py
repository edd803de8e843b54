"""Celery tasks of grading: execute a queued run, and fail runs whose worker never came or died."""

from __future__ import annotations

from celery import shared_task

from grading import services


@shared_task(name="grading.tasks.grading_run_execute", acks_late=True)
def grading_run_execute(run_id: int) -> str:
    """Run a queued grading run in the guest. Idempotent: the run is claimed with a conditional update, so a
    redelivered message for a run already taken does nothing."""
    run = services.grading_run_execute(run_id=run_id)
    return "skipped" if run is None else run.state


@shared_task(name="grading.tasks.grading_runs_sweep", acks_late=True)
def grading_runs_sweep() -> int:
    """Periodic (beat): fail runs queued too long or running past their deadline, so attempts are not blocked."""
    return services.grading_runs_fail_stale()
