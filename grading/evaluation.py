"""Pure grading rules, tested with literal inputs: a check's raw result into points and feedback (exit code, then
``contains`` or a time-limited ``regex``), lateness into a per-started-day penalty up to the credit window's
close, and the scored runs of a student's attempts into a grade (``best`` or ``last``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import regex
from django.utils.translation import gettext as _

from labs.models import Check, GradePolicy, Lab, StdoutMatch
from labs.patterns import PatternTimeout, pattern_timeout_seconds, search

logger = logging.getLogger(__name__)

HUNDRED = Decimal(100)
CENT = Decimal("0.01")


@dataclass(frozen=True)
class CheckVerdict:
    passed: bool
    points: Decimal
    max_points: Decimal
    feedback: str
    reason: str  # why it failed, in plain words, for logs and staff (the hint is what students see)
    pattern_timeout_seconds: float | None = None  # set when the output pattern ran out of time: not judged


def evaluate_check(*, check: Check, result: Mapping[str, Any]) -> CheckVerdict:
    """Score one check from the agent's raw result for it."""
    max_points = Decimal(check.points)
    try:
        reason = _failure_reason(check=check, result=result)
    except PatternTimeout:
        seconds = pattern_timeout_seconds()
        logger.warning("check %r: its output pattern took longer than %s s to match", check, seconds)
        return CheckVerdict(
            passed=False,
            points=Decimal(0),
            max_points=max_points,
            feedback="",
            reason=f"the output pattern took longer than {seconds:g} s to match",
            pattern_timeout_seconds=seconds,
        )
    if reason:
        return CheckVerdict(
            passed=False, points=Decimal(0), max_points=max_points, feedback=check.hint or "", reason=reason
        )
    return CheckVerdict(passed=True, points=max_points, max_points=max_points, feedback="", reason="")


def pattern_timeout_feedback(seconds: float) -> str:
    """What a check whose output pattern ran out of time after ``seconds`` says, in the active language."""
    return _(
        "This check could not be judged: its expected-output pattern took longer than %(seconds)s s to match "
        "the output. Tell your instructor, who needs to simplify the pattern; it counts as not passed until then."
    ) % {"seconds": f"{seconds:g}"}


def _failure_reason(*, check: Check, result: Mapping[str, Any]) -> str:
    if result.get("timed_out"):
        return "timed out"
    exit_code = result.get("exit_code")
    if exit_code is None:
        return "the command could not be run"
    if check.expected_exit_code is not None and exit_code != check.expected_exit_code:
        return f"exit code {exit_code}, expected {check.expected_exit_code}"
    stdout = result.get("stdout") or ""
    pattern = check.stdout_pattern.replace("\r\n", "\n")  # typed in a textarea, whose line breaks are CRLF
    if check.stdout_match == StdoutMatch.CONTAINS and pattern not in stdout:
        return "output does not contain the expected text"
    if check.stdout_match == StdoutMatch.REGEX:
        try:
            matched = search(pattern, stdout)  # raises PatternTimeout when it runs out of time
        except regex.error:
            matched = False  # Check.clean refuses such patterns; one saved around it fails the check, not the run
        if not matched:
            return "output does not match the expected pattern"
    return ""


def days_late(*, due_at: datetime | None, measured_at: datetime) -> int:
    """Started days after the due time (0 when on time). Partial days round up."""
    if due_at is None or measured_at <= due_at:
        return 0
    return math.ceil((measured_at - due_at) / timedelta(days=1))


def credit_closes_at(lab: Lab) -> datetime | None:
    """When work stops earning credit (see the module docstring)."""
    if lab.late_cutoff_at is not None:
        return lab.late_cutoff_at
    if lab.due_at is not None and not lab.late_penalty_percent_per_day:
        return lab.due_at
    return None


def earns_credit(lab: Lab, *, measured_at: datetime) -> bool:
    closes = credit_closes_at(lab)
    return closes is None or measured_at <= closes


def late_penalty_percent(lab: Lab, *, measured_at: datetime) -> Decimal:
    """The penalty for work measured at ``measured_at``: 100 when it earns no credit at all."""
    if not earns_credit(lab, measured_at=measured_at):
        return HUNDRED
    days = days_late(due_at=lab.due_at, measured_at=measured_at)
    return min(HUNDRED, Decimal(days) * Decimal(lab.late_penalty_percent_per_day)).quantize(CENT)


def apply_penalty(*, score: Decimal, penalty_percent: Decimal) -> Decimal:
    factor = (HUNDRED - min(penalty_percent, HUNDRED)) / HUNDRED
    return (score * factor).quantize(CENT)


@dataclass(frozen=True)
class ScoredRun:
    """What the grade policy needs to know about a finished run."""

    run_id: int
    score: Decimal  # raw points earned
    penalty_percent: Decimal
    measured_at: datetime

    @property
    def effective_score(self) -> Decimal:
        return apply_penalty(score=self.score, penalty_percent=self.penalty_percent)


def choose_run(*, policy: str, runs: Sequence[ScoredRun]) -> ScoredRun | None:
    """The run that counts under ``policy`` among runs that earn credit (callers filter the others out)."""
    if not runs:
        return None
    if policy == GradePolicy.LAST:
        return max(runs, key=lambda r: (r.measured_at, r.run_id))
    # best: highest after penalty; on a tie the earliest, so a later equal run never makes a grade late.
    return min(runs, key=lambda r: (-r.effective_score, r.measured_at, r.run_id))
