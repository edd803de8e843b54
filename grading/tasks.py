"""Celery tasks of grading: execute a queued run, carry out a lab-wide regrade, and fail runs (and regrades)
whose worker never came or died."""

from __future__ import annotations

from celery import shared_task

from grading import services


@shared_task(name="grading.tasks.grading_run_execute", acks_late=True)
def grading_run_execute(run_id: int) -> str:
    """Run a queued grading run in the guest; a redelivered message finds it claimed and does nothing."""
    run = services.grading_run_execute(run_id=run_id)
    return "skipped" if run is None else run.state


@shared_task(name="grading.tasks.lab_regrade_execute", acks_late=True)
def lab_regrade_execute(regrade_id: int) -> str:
    """Carry out a queued lab regrade; a redelivered message finds it done and does nothing."""
    regrade = services.lab_regrade_execute(regrade_id=regrade_id)
    return "skipped" if regrade is None else regrade.state


@shared_task(name="grading.tasks.grading_runs_sweep", acks_late=True)
def grading_runs_sweep() -> int:
    """Periodic: fail runs and lab regrades whose worker never came or died, so new ones can be asked for."""
    return services.grading_runs_fail_stale() + services.lab_regrades_fail_stale()
