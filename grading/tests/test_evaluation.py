"""The pure grading rules: check verdicts, lateness, the credit window and the choice of the counted run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from grading.evaluation import (
    ScoredRun,
    apply_penalty,
    choose_run,
    credit_closes_at,
    days_late,
    earns_credit,
    evaluate_check,
    late_penalty_percent,
    pattern_timeout_feedback,
)
from labs.models import GradePolicy, StdoutMatch


@dataclass
class CheckSpec:
    expected_exit_code: int | None = 0
    stdout_match: str = StdoutMatch.NONE
    stdout_pattern: str = ""
    points: Decimal = Decimal("2")
    hint: str = "Look again at step 3."


@dataclass
class LabSpec:
    due_at: datetime | None = None
    late_cutoff_at: datetime | None = None
    late_penalty_percent_per_day: Decimal = Decimal("10")


def result(**fields):
    base = {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "duration_ms": 5}
    base.update(fields)
    return base


DUE = datetime(2026, 11, 20, 23, 59, tzinfo=UTC)


class TestCheckVerdicts:
    def test_expected_exit_code_passes_with_full_points_and_no_feedback(self):
        verdict = evaluate_check(check=CheckSpec(), result=result(exit_code=0))
        assert (verdict.passed, verdict.points, verdict.max_points, verdict.feedback) == (
            True,
            Decimal("2"),
            Decimal("2"),
            "",
        )

    def test_other_exit_code_fails_with_the_hint(self):
        verdict = evaluate_check(check=CheckSpec(), result=result(exit_code=1))
        assert not verdict.passed
        assert verdict.points == 0
        assert verdict.max_points == Decimal("2")
        assert verdict.feedback == "Look again at step 3."
        assert verdict.reason == "exit code 1, expected 0"

    def test_nonzero_expected_exit_code(self):
        check = CheckSpec(expected_exit_code=3)
        assert evaluate_check(check=check, result=result(exit_code=3)).passed
        assert not evaluate_check(check=check, result=result(exit_code=0)).passed

    def test_ignored_exit_code_with_output_expectation(self):
        check = CheckSpec(expected_exit_code=None, stdout_match=StdoutMatch.CONTAINS, stdout_pattern="ready")
        assert evaluate_check(check=check, result=result(exit_code=7, stdout="service ready\n")).passed
        assert not evaluate_check(check=check, result=result(exit_code=0, stdout="starting\n")).passed

    def test_contains_is_a_plain_substring_test(self):
        check = CheckSpec(stdout_match=StdoutMatch.CONTAINS, stdout_pattern="a.b")
        assert evaluate_check(check=check, result=result(stdout="x a.b y")).passed
        assert not evaluate_check(check=check, result=result(stdout="x aXb y")).passed

    def test_contains_needs_the_exit_code_too(self):
        check = CheckSpec(stdout_match=StdoutMatch.CONTAINS, stdout_pattern="hello world")
        verdict = evaluate_check(check=check, result=result(exit_code=1, stdout="hello world"))
        assert not verdict.passed

    def test_regex_searches_every_line(self):
        check = CheckSpec(stdout_match=StdoutMatch.REGEX, stdout_pattern=r"^port\s+8080$")
        assert evaluate_check(check=check, result=result(stdout="host a\nport 8080\nend\n")).passed
        assert not evaluate_check(check=check, result=result(stdout="port 80801\n")).passed

    def test_patterns_of_several_lines_match_whatever_line_breaks_the_admin_form_saved(self):
        for match, pattern in ((StdoutMatch.CONTAINS, "one\r\ntwo"), (StdoutMatch.REGEX, "^one$\r\n^two$")):
            check = CheckSpec(stdout_match=match, stdout_pattern=pattern)
            assert evaluate_check(check=check, result=result(stdout="one\ntwo\n")).passed, match

    def test_regex_handles_japanese_output(self):
        check = CheckSpec(stdout_match=StdoutMatch.REGEX, stdout_pattern=r"こんにちは\s*世界")
        assert evaluate_check(check=check, result=result(stdout="こんにちは 世界\n")).passed

    def test_invalid_regex_fails_the_check_instead_of_raising(self):
        check = CheckSpec(stdout_match=StdoutMatch.REGEX, stdout_pattern="(unclosed")
        verdict = evaluate_check(check=check, result=result(stdout="(unclosed"))
        assert not verdict.passed

    def test_regex_that_runs_out_of_time_fails_with_feedback_saying_so(self, settings):
        settings.GRADING_PATTERN_TIMEOUT_MS = 100
        check = CheckSpec(stdout_match=StdoutMatch.REGEX, stdout_pattern=r"^(a|a)*$")
        started = time.process_time()  # the engine's limit counts CPU time, which load does not stretch
        verdict = evaluate_check(check=check, result=result(stdout="a" * 40 + "!"))
        assert time.process_time() - started < 2
        assert (verdict.passed, verdict.points, verdict.max_points) == (False, Decimal(0), Decimal("2"))
        assert verdict.reason == "the output pattern took longer than 0.1 s to match"
        # Not the hint, which would blame the student's work: the time limit, put into words when read.
        assert verdict.feedback == "" and verdict.pattern_timeout_seconds == 0.1
        words = pattern_timeout_feedback(verdict.pattern_timeout_seconds)
        assert "could not be judged" in words and "0.1 s" in words

    def test_timeout_fails_even_with_matching_output(self):
        check = CheckSpec(stdout_match=StdoutMatch.CONTAINS, stdout_pattern="done")
        verdict = evaluate_check(check=check, result=result(exit_code=None, stdout="done", timed_out=True))
        assert not verdict.passed
        assert verdict.reason == "timed out"
        assert verdict.feedback == "Look again at step 3."

    def test_command_that_could_not_start_fails(self):
        verdict = evaluate_check(
            check=CheckSpec(expected_exit_code=None, stdout_match=StdoutMatch.CONTAINS, stdout_pattern=""),
            result=result(exit_code=None),
        )
        assert not verdict.passed

    def test_failure_without_hint_has_empty_feedback(self):
        verdict = evaluate_check(check=CheckSpec(hint=""), result=result(exit_code=2))
        assert verdict.feedback == ""


class TestLateness:
    def test_on_time_is_zero_days(self):
        assert days_late(due_at=DUE, measured_at=DUE) == 0
        assert days_late(due_at=DUE, measured_at=DUE - timedelta(hours=5)) == 0
        assert days_late(due_at=None, measured_at=DUE) == 0

    @pytest.mark.parametrize(
        ("late_by", "days"),
        [
            (timedelta(minutes=1), 1),
            (timedelta(hours=23, minutes=59), 1),
            (timedelta(days=1), 1),
            (timedelta(days=1, seconds=1), 2),
            (timedelta(days=2, hours=12), 3),
        ],
    )
    def test_partial_days_round_up(self, late_by, days):
        assert days_late(due_at=DUE, measured_at=DUE + late_by) == days

    def test_penalty_per_started_day(self):
        lab = LabSpec(due_at=DUE, late_penalty_percent_per_day=Decimal("15"))
        assert late_penalty_percent(lab, measured_at=DUE) == 0
        assert late_penalty_percent(lab, measured_at=DUE + timedelta(hours=2)) == Decimal("15.00")
        assert late_penalty_percent(lab, measured_at=DUE + timedelta(days=2, hours=1)) == Decimal("45.00")

    def test_penalty_is_capped_at_100(self):
        lab = LabSpec(due_at=DUE, late_penalty_percent_per_day=Decimal("40"))
        assert late_penalty_percent(lab, measured_at=DUE + timedelta(days=5)) == Decimal("100.00")

    def test_after_cutoff_no_credit(self):
        cutoff = DUE + timedelta(days=3)
        lab = LabSpec(due_at=DUE, late_cutoff_at=cutoff, late_penalty_percent_per_day=Decimal("10"))
        assert earns_credit(lab, measured_at=cutoff)
        assert not earns_credit(lab, measured_at=cutoff + timedelta(seconds=1))
        assert late_penalty_percent(lab, measured_at=cutoff + timedelta(seconds=1)) == Decimal("100")

    def test_without_per_day_penalty_the_due_date_closes_credit(self):
        lab = LabSpec(due_at=DUE, late_penalty_percent_per_day=Decimal("0"))
        assert credit_closes_at(lab) == DUE
        assert not earns_credit(lab, measured_at=DUE + timedelta(minutes=1))

    def test_no_dates_means_always_credit(self):
        lab = LabSpec()
        assert credit_closes_at(lab) is None
        assert late_penalty_percent(lab, measured_at=DUE) == 0

    def test_apply_penalty_rounds_to_cents(self):
        assert apply_penalty(score=Decimal("3"), penalty_percent=Decimal("33.33")) == Decimal("2.00")
        assert apply_penalty(score=Decimal("7"), penalty_percent=Decimal("10")) == Decimal("6.30")
        assert apply_penalty(score=Decimal("7"), penalty_percent=Decimal("150")) == Decimal("0.00")


class TestChooseRun:
    def runs(self):
        return [
            ScoredRun(run_id=1, score=Decimal("3"), penalty_percent=Decimal(0), measured_at=DUE - timedelta(days=2)),
            ScoredRun(run_id=2, score=Decimal("5"), penalty_percent=Decimal(0), measured_at=DUE - timedelta(days=1)),
            ScoredRun(run_id=3, score=Decimal("2"), penalty_percent=Decimal(0), measured_at=DUE - timedelta(hours=1)),
        ]

    def test_best_takes_the_highest(self):
        assert choose_run(policy=GradePolicy.BEST, runs=self.runs()).run_id == 2

    def test_last_takes_the_most_recent(self):
        assert choose_run(policy=GradePolicy.LAST, runs=self.runs()).run_id == 3

    def test_best_compares_after_penalty(self):
        runs = [
            ScoredRun(run_id=1, score=Decimal("8"), penalty_percent=Decimal(0), measured_at=DUE),
            ScoredRun(run_id=2, score=Decimal("10"), penalty_percent=Decimal(30), measured_at=DUE + timedelta(hours=1)),
        ]
        assert choose_run(policy=GradePolicy.BEST, runs=runs).run_id == 1

    def test_best_prefers_the_earliest_on_a_tie(self):
        runs = [
            ScoredRun(run_id=7, score=Decimal("4"), penalty_percent=Decimal(0), measured_at=DUE + timedelta(hours=1)),
            ScoredRun(run_id=5, score=Decimal("4"), penalty_percent=Decimal(0), measured_at=DUE - timedelta(hours=1)),
        ]
        assert choose_run(policy=GradePolicy.BEST, runs=runs).run_id == 5

    def test_no_runs(self):
        assert choose_run(policy=GradePolicy.BEST, runs=[]) is None
