"""Builders for grading tests: attempts in a given state and runs recorded through the real recording service."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from grading.models import GradingRun, RunState, RunTrigger
from grading.services.runs import grading_run_record, lab_checks
from labs.models import Attempt, AttemptState, Lab
from portal.models import User


def make_attempt(
    *, lab: Lab, student: User, state: str = AttemptState.RUNNING, number: int | None = None, **fields: Any
) -> Attempt:
    if number is None:
        number = Attempt.objects.filter(lab=lab, student=student).count() + 1
    return Attempt.objects.create(
        lab=lab,
        student=student,
        tenant=lab.course.tenant,
        state=state,
        number=number,
        vm_name=fields.pop("vm_name", f"attempt-{lab.pk}-{student.pk}-{number}"),
        namespace=fields.pop("namespace", lab.course.tenant.namespace),
        agent_token=fields.pop("agent_token", "test-token"),
        **fields,
    )


def agent_result(
    *, exit_code: int | None = 0, stdout: str = "", stderr: str = "", timed_out: bool = False, duration_ms: int = 12
) -> dict[str, Any]:
    return {
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": timed_out,
        "duration_ms": duration_ms,
        "stdout_truncated": False,
        "stderr_truncated": False,
    }


# Outputs for the conftest lab (check 1: `test -f ~/hello.txt`, 1 point; check 2: `cat ~/hello.txt` containing
# "hello world", 2 points).
ALL_PASS = {1: agent_result(), 2: agent_result(stdout="hello world\n")}
FIRST_ONLY = {1: agent_result(), 2: agent_result(stdout="goodbye\n")}
NONE_PASS = {1: agent_result(exit_code=1), 2: agent_result(exit_code=1, stderr="No such file or directory")}


def record_run(
    *,
    attempt: Attempt,
    outputs: dict[int, dict[str, Any]],
    measured_at: datetime | None = None,
    trigger: str = RunTrigger.STUDENT,
) -> GradingRun:
    """A run of ``attempt`` whose agent answered ``outputs`` (by check order), recorded as a worker would."""
    measured_at = measured_at or timezone.now()
    run = GradingRun.objects.create(attempt=attempt, state=RunState.RUNNING, trigger=trigger, started_at=measured_at)
    checks = lab_checks(attempt=attempt)
    return grading_run_record(
        run=run, checks=checks, results=[outputs[c.order] for c in checks], measured_at=measured_at
    )
