"""The final grading run at an attempt's expiry or stop, made synchronously while the guest is still there."""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.utils import timezone

from grading.models import GradingRun, RunState, RunTrigger
from grading.services.runs import (
    ERROR_REPLACED,
    ERROR_STALE,
    create_unfinished_run,
    grading_run_fail,
    lab_checks,
    measure_and_record,
    push_run_on_commit,
)
from labs import agent_client
from labs.models import Attempt
from portal.errors import Conflict

logger = logging.getLogger(__name__)

FINAL_RUN_POLL_SECONDS = 0.25


def grading_run_final(*, attempt: Attempt, trigger: str) -> GradingRun | None:
    """Grade the attempt once more before its VM is deleted (None: nothing to grade); agent trouble ends the run in
    ``error``. Call it outside a transaction: it blocks on the guest for up to the sum of the checks' timeouts."""
    if trigger not in (RunTrigger.EXPIRY, RunTrigger.STOP):
        raise ValueError(f"a final run is triggered by expiry or stop, not {trigger!r}")
    attempt = Attempt.objects.select_related("lab").get(pk=attempt.pk)
    checks = lab_checks(attempt=attempt)
    if not checks or not attempt.vm_name or attempt.agent_ready_at is None:
        return None
    for _round in range(3):
        _make_room_for_final_run(attempt=attempt)
        try:
            with transaction.atomic():
                run = create_unfinished_run(attempt=attempt, state=RunState.RUNNING, trigger=trigger, requested_by=None)
                push_run_on_commit(run=run, results=[])
            break
        except Conflict:
            continue  # a Check press landed between the clean-up and the insert: clear it again
    else:
        logger.error("attempt %s: could not start its final grading run", attempt.pk)
        return None
    return measure_and_record(run=run, attempt=attempt, checks=checks)


def _make_room_for_final_run(*, attempt: Attempt) -> None:
    for run in GradingRun.objects.filter(attempt=attempt, state=RunState.QUEUED):
        grading_run_fail(run=run, error_code=ERROR_REPLACED, error="replaced by the attempt's final run")
    running = GradingRun.objects.filter(attempt=attempt, state=RunState.RUNNING).first()
    if running is None:
        return
    limit = agent_client.deadline_for_checks(lab_checks(attempt=attempt))
    started = running.started_at or running.created_at
    wait_until = time.monotonic() + max(0.0, limit - (timezone.now() - started).total_seconds())
    while time.monotonic() < wait_until:
        if not GradingRun.objects.filter(pk=running.pk, state=RunState.RUNNING).exists():
            return
        time.sleep(FINAL_RUN_POLL_SECONDS)
    grading_run_fail(run=running, error_code=ERROR_STALE, error="still running when the final run began")
