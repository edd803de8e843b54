"""Grade policies on stored runs: best vs last, late penalty, cutoff, overrides (audited) and regrades."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from grading.models import CheckResult, Grade, GradingRun, RunState, RunTrigger
from grading.services import grade_override, grading_regrade
from grading.services.regrades import grading_regrade_lab
from grading.tests.builders import ALL_PASS, FIRST_ONLY, NONE_PASS, agent_result, make_attempt, record_run
from labs.models import AttemptState, GradePolicy, StdoutMatch
from portal.errors import ApplicationError, NotFound, PermissionDenied
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


def grade_of(lab, student) -> Grade:
    return Grade.objects.get(lab=lab, student=student)


class TestBestAndLast:
    def test_best_keeps_the_highest_run(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        now = timezone.now()
        record_run(attempt=attempt, outputs=ALL_PASS, measured_at=now - timedelta(minutes=10))
        record_run(attempt=attempt, outputs=FIRST_ONLY, measured_at=now)
        grade = grade_of(lab_a, student_a)
        assert grade.score == Decimal("3.00")
        assert grade.max_score == Decimal("3.00")
        assert grade.final_score == Decimal("3.00")

    def test_last_takes_the_latest_run(self, lab_a, student_a):
        lab_a.grade_policy = GradePolicy.LAST
        lab_a.save()
        attempt = make_attempt(lab=lab_a, student=student_a)
        now = timezone.now()
        record_run(attempt=attempt, outputs=ALL_PASS, measured_at=now - timedelta(minutes=10))
        last = record_run(attempt=attempt, outputs=FIRST_ONLY, measured_at=now)
        grade = grade_of(lab_a, student_a)
        assert grade.score == Decimal("1.00")
        assert grade.source_run_id == last.pk

    def test_policy_spans_all_attempts_of_the_student(self, lab_a, student_a):
        now = timezone.now()
        first = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        best = record_run(attempt=first, outputs=ALL_PASS, measured_at=now - timedelta(days=1))
        second = make_attempt(lab=lab_a, student=student_a)
        record_run(attempt=second, outputs=NONE_PASS, measured_at=now)
        grade = grade_of(lab_a, student_a)
        assert grade.score == Decimal("3.00")
        assert grade.source_run_id == best.pk

    def test_error_runs_never_count(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        GradingRun.objects.create(
            attempt=attempt,
            state=RunState.ERROR,
            score=Decimal("3"),
            measured_at=timezone.now(),
            error_code="agent_timeout",
        )
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        assert grade_of(lab_a, student_a).score == Decimal("1.00")

    def test_results_carry_points_and_hints(self, lab_a, student_a):
        run = record_run(attempt=make_attempt(lab=lab_a, student=student_a), outputs=FIRST_ONLY)
        results = list(run.results.order_by("order"))
        assert [(r.passed, r.points, r.max_points) for r in results] == [
            (True, Decimal("1.00"), Decimal("1.00")),
            (False, Decimal("0.00"), Decimal("2.00")),
        ]
        assert results[0].feedback == ""
        assert results[1].feedback == "The file must contain the words hello world."
        assert results[1].stdout == "goodbye\n"
        assert (run.state, run.score, run.max_score) == (RunState.DONE, Decimal("1.00"), Decimal("3.00"))


class TestLateness:
    def test_late_penalty_per_started_day(self, lab_a, student_a):
        due = timezone.now() - timedelta(days=2)
        lab_a.due_at = due
        lab_a.late_penalty_percent_per_day = Decimal("10")
        lab_a.save()
        attempt = make_attempt(lab=lab_a, student=student_a)
        run = record_run(attempt=attempt, outputs=ALL_PASS, measured_at=due + timedelta(days=1, hours=2))
        assert run.late_penalty_percent == Decimal("20.00")  # one day and two hours: two started days
        grade = grade_of(lab_a, student_a)
        assert grade.score == Decimal("2.40")
        assert grade.late is True

    def test_on_time_run_beats_a_penalised_better_one(self, lab_a, student_a):
        due = timezone.now() - timedelta(days=3)
        lab_a.due_at = due
        lab_a.late_penalty_percent_per_day = Decimal("50")
        lab_a.save()
        attempt = make_attempt(lab=lab_a, student=student_a)
        on_time = record_run(attempt=attempt, outputs=FIRST_ONLY, measured_at=due - timedelta(hours=1))
        record_run(attempt=attempt, outputs=ALL_PASS, measured_at=due + timedelta(days=1, minutes=1))  # 3 × 0 %
        grade = grade_of(lab_a, student_a)
        assert grade.source_run_id == on_time.pk
        assert grade.score == Decimal("1.00")
        assert grade.late is False

    def test_no_credit_after_cutoff_but_earlier_work_stands(self, lab_a, student_a):
        lab_a.grade_policy = GradePolicy.LAST
        due = timezone.now() - timedelta(days=5)
        lab_a.due_at = due
        lab_a.late_cutoff_at = due + timedelta(days=2)
        lab_a.late_penalty_percent_per_day = Decimal("10")
        lab_a.save()
        attempt = make_attempt(lab=lab_a, student=student_a)
        counted = record_run(attempt=attempt, outputs=FIRST_ONLY, measured_at=due + timedelta(hours=3))
        after = record_run(attempt=attempt, outputs=ALL_PASS, measured_at=due + timedelta(days=3))
        assert after.late_penalty_percent == Decimal("100")
        assert after.effective_score == Decimal("0.00")
        grade = grade_of(lab_a, student_a)
        assert grade.source_run_id == counted.pk  # "last" ignores the run past the cutoff
        assert grade.score == Decimal("0.90")
        assert grade.late is True

    def test_only_work_after_cutoff_means_no_grade(self, lab_a, student_a):
        due = timezone.now() - timedelta(days=5)
        lab_a.due_at = due
        lab_a.late_cutoff_at = due + timedelta(days=1)
        lab_a.late_penalty_percent_per_day = Decimal("10")
        lab_a.save()
        record_run(
            attempt=make_attempt(lab=lab_a, student=student_a), outputs=ALL_PASS, measured_at=due + timedelta(days=2)
        )
        grade = grade_of(lab_a, student_a)
        assert grade.score is None
        assert grade.final_score is None
        assert grade.max_score == Decimal("3.00")


class TestOverride:
    def test_override_wins_and_is_audited(self, lab_a, student_a, ta_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        grade = grade_override(
            actor=ta_a,
            lab=lab_a,
            student=student_a,
            score=Decimal("2.5"),
            reason="Check 2 misread a trailing space; verified by hand.",
        )
        assert grade.final_score == Decimal("2.50")
        assert grade.score == Decimal("1.00")
        assert grade.overridden_by == ta_a
        assert grade.overridden_at is not None
        event = AuditEvent.objects.get(action="grading.override_set")
        assert event.actor == ta_a
        assert event.course == lab_a.course
        assert event.tenant == lab_a.course.tenant
        assert event.data["reason"] == "Check 2 misread a trailing space; verified by hand."
        assert event.data["previous"] is None
        assert event.data["override"] == "2.50"
        assert event.data["computed"] == "1.00"

        # A later, better run changes the computed score, not the final one.
        record_run(attempt=attempt, outputs=ALL_PASS)
        grade.refresh_from_db()
        assert grade.score == Decimal("3.00")
        assert grade.final_score == Decimal("2.50")

    def test_removing_the_override_restores_the_computed_grade(self, lab_a, student_a, instructor_a):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a), outputs=FIRST_ONLY)
        grade_override(actor=instructor_a, lab=lab_a, student=student_a, score=Decimal("3"), reason="Regrade by hand")
        grade = grade_override(actor=instructor_a, lab=lab_a, student=student_a, score=None, reason="Mistake")
        assert grade.final_score == Decimal("1.00")
        assert grade.override_reason == ""
        assert AuditEvent.objects.filter(action="grading.override_removed", data__reason="Mistake").count() == 1

    def test_override_without_any_run_creates_the_grade(self, lab_a, student_a, instructor_a):
        grade = grade_override(
            actor=instructor_a, lab=lab_a, student=student_a, score=Decimal("0"), reason="Academic integrity case 12"
        )
        assert grade.final_score == Decimal("0.00")
        assert grade.score is None

    @pytest.mark.parametrize("reason", ["", "   \n"])
    def test_reason_is_required_and_nothing_changes(self, lab_a, student_a, ta_a, reason):
        with pytest.raises(ApplicationError, match="reason"):
            grade_override(actor=ta_a, lab=lab_a, student=student_a, score=Decimal("2"), reason=reason)
        assert not Grade.objects.filter(lab=lab_a, student=student_a).exists()
        assert not AuditEvent.objects.exists()

    @pytest.mark.parametrize("score", [Decimal("-1"), Decimal("3.01")])
    def test_score_must_be_within_the_lab_points(self, lab_a, student_a, ta_a, score):
        with pytest.raises(ApplicationError):
            grade_override(actor=ta_a, lab=lab_a, student=student_a, score=score, reason="x")
        assert not AuditEvent.objects.exists()

    def test_staff_of_another_tenant_cannot_override(self, lab_a, student_a, instructor_b):
        with pytest.raises(NotFound):
            grade_override(actor=instructor_b, lab=lab_a, student=student_a, score=Decimal("1"), reason="x")

    def test_students_cannot_override(self, lab_a, student_a):
        with pytest.raises(NotFound):
            grade_override(actor=student_a, lab=lab_a, student=student_a, score=Decimal("3"), reason="I deserve it")

    def test_only_students_of_the_course_can_be_overridden(self, lab_a, student_b, ta_a):
        with pytest.raises(NotFound):
            grade_override(actor=ta_a, lab=lab_a, student=student_b, score=Decimal("1"), reason="x")


class TestRegrade:
    def fix_check_two(self, lab):
        """The instructor relaxes check 2: any capitalisation of hello world now passes."""
        check = lab.checks.get(order=2)
        check.stdout_match = StdoutMatch.REGEX
        check.stdout_pattern = r"(?i)hello\s+world"
        check.save()
        return check

    def test_regrade_reevaluates_stored_outputs_after_a_check_changes(self, lab_a, student_a, instructor_a):
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        outputs = {1: agent_result(), 2: agent_result(stdout="Hello World\n")}
        original = record_run(attempt=attempt, outputs=outputs)
        assert grade_of(lab_a, student_a).score == Decimal("1.00")

        self.fix_check_two(lab_a)
        outcome = grading_regrade(actor=instructor_a, attempt=attempt)

        assert outcome.queued is None  # the attempt is over: nothing to run in the guest
        [regrade] = outcome.reevaluated
        assert regrade.trigger == RunTrigger.REGRADE
        assert regrade.regrade_of_id == original.pk
        assert regrade.state == RunState.DONE
        assert regrade.score == Decimal("3.00")
        assert regrade.measured_at == original.measured_at
        assert CheckResult.objects.get(run=regrade, order=2).stdout == "Hello World\n"
        grade = grade_of(lab_a, student_a)
        assert grade.score == Decimal("3.00")
        assert grade.source_run_id == regrade.pk
        event = AuditEvent.objects.get(action="grading.regraded")
        assert event.actor == instructor_a
        assert event.data["reevaluated_runs"] == [original.pk]

    def test_superseded_runs_stop_counting(self, lab_a, student_a, instructor_a):
        """A stricter check after a regrade lowers the grade: the old, more generous evaluation is replaced."""
        lab_a.grade_policy = GradePolicy.BEST
        lab_a.save()
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        record_run(attempt=attempt, outputs=ALL_PASS)
        check = lab_a.checks.get(order=2)
        check.stdout_pattern = "hello world!"
        check.save()
        grading_regrade(actor=instructor_a, attempt=attempt)
        assert grade_of(lab_a, student_a).score == Decimal("1.00")
        # Regrading twice re-evaluates the latest evaluation only, one new run per original measurement.
        outcome = grading_regrade(actor=instructor_a, attempt=attempt)
        assert len(outcome.reevaluated) == 1
        assert GradingRun.objects.filter(attempt=attempt, state=RunState.DONE).count() == 3

    def test_regrade_reruns_in_the_guest_while_the_attempt_runs(
        self, lab_a, student_a, ta_a, django_capture_on_commit_callbacks
    ):
        attempt = make_attempt(lab=lab_a, student=student_a)
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            outcome = grading_regrade(actor=ta_a, attempt=attempt)
        assert len(outcome.reevaluated) == 1
        assert outcome.queued is not None
        assert outcome.queued.state == RunState.QUEUED
        assert outcome.queued.trigger == RunTrigger.REGRADE
        assert outcome.queued.requested_by == ta_a
        assert callbacks  # the execution task and the browser pushes wait for the commit

    def test_added_check_without_output_fails_in_a_regrade(self, lab_a, student_a, instructor_a):
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        record_run(attempt=attempt, outputs=ALL_PASS)
        lab_a.checks.create(
            order=3, title="nginx runs", command="systemctl is-active nginx", points=2, hint="Start nginx."
        )
        [regrade] = grading_regrade(actor=instructor_a, attempt=attempt).reevaluated
        assert (regrade.score, regrade.max_score) == (Decimal("3.00"), Decimal("5.00"))
        added = regrade.results.get(order=3)
        assert not added.passed
        assert added.feedback == "Start nginx."

    def test_students_and_other_tenants_cannot_regrade(self, lab_a, student_a, instructor_b):
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        with pytest.raises(PermissionDenied):
            grading_regrade(actor=student_a, attempt=attempt)
        with pytest.raises(NotFound):
            grading_regrade(actor=instructor_b, attempt=attempt)
        assert GradingRun.objects.filter(trigger=RunTrigger.REGRADE).count() == 0
        assert not AuditEvent.objects.filter(action__startswith="grading.regrade").exists()

    def test_lab_regrade_covers_every_student(self, lab_a, student_a, course_a, tenant_a, instructor_a):
        from conftest import make_person
        from portal.models import Role

        other = make_person(username="student_c", tenant=tenant_a, course=course_a, role=Role.STUDENT)
        for student in (student_a, other):
            attempt = make_attempt(lab=lab_a, student=student, state=AttemptState.STOPPED)
            record_run(attempt=attempt, outputs={1: agent_result(), 2: agent_result(stdout="HELLO WORLD")})
        self.fix_check_two(lab_a)
        outcome = grading_regrade_lab(actor=instructor_a, lab=lab_a)
        assert (outcome.attempts, outcome.reevaluated, outcome.queued) == (2, 2, 0)
        assert grade_of(lab_a, student_a).score == Decimal("3.00")
        assert grade_of(lab_a, other).score == Decimal("3.00")
        assert AuditEvent.objects.filter(action="grading.lab_regraded").count() == 1
