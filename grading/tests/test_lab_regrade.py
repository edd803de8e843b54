"""Lab-wide regrades: the request only queues one (answered at once), the Celery task does the work and records
its outcome for the lab report; permissions and tenant scoping as for every staff page."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from conftest import make_person
from grading import tasks
from grading.models import Grade, GradingRun, LabRegrade, RunState, RunTrigger
from grading.services import lab_regrade_execute, lab_regrade_request, lab_regrades_fail_stale
from grading.tests.builders import agent_result, make_attempt, record_run
from labs.models import AttemptState, StdoutMatch
from portal.errors import NotFound
from portal.models import AuditEvent, Membership, Role

pytestmark = pytest.mark.django_db

SHOUTED = {1: agent_result(), 2: agent_result(stdout="HELLO WORLD\n")}


@pytest.fixture
def shouted_lab(lab_a, student_a, tenant_a, course_a):
    """Two students whose stopped attempts scored 1 of 3 (check 2 wanted lower case), then check 2 relaxed."""
    other = make_person(username="student_c", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    for student in (student_a, other):
        record_run(attempt=make_attempt(lab=lab_a, student=student, state=AttemptState.STOPPED), outputs=SHOUTED)
    lab_a.checks.filter(order=2).update(stdout_match=StdoutMatch.REGEX, stdout_pattern=r"(?i)hello\s+world")
    return lab_a, other


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """Regrade ids sent to the task queue (instead of a broker)."""
    ids: list[int] = []
    monkeypatch.setattr(tasks.lab_regrade_execute, "delay", lambda regrade_id: ids.append(regrade_id))
    return ids


def post_regrade(client, lab):
    return client.post(reverse("grading:lab_regrade", args=[lab.pk]))


@pytest.fixture
def press_regrade(client, django_capture_on_commit_callbacks):
    """Press "Regrade all" on the lab report as ``person``; on-commit callbacks run as after a real commit."""

    def press(person, lab):
        client.force_login(person)
        with django_capture_on_commit_callbacks(execute=True):
            return post_regrade(client, lab)

    return press


class TestView:
    def test_answers_at_once_and_queues_the_task_on_commit(
        self, client, instructor_a, shouted_lab, sent, django_capture_on_commit_callbacks
    ):
        lab, _other = shouted_lab
        client.force_login(instructor_a)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = post_regrade(client, lab)
        assert response.status_code == 302
        assert response["Location"] == reverse("grading:lab_report", args=[lab.pk])
        assert [str(m) for m in get_messages(response.wsgi_request)] == [
            "Regrade queued for 2 attempts. Its outcome appears under Regrades when it is done."
        ]
        regrade = LabRegrade.objects.get(lab=lab)
        assert (regrade.state, regrade.attempts_requested, regrade.requested_by) == (RunState.QUEUED, 2, instructor_a)
        # Nothing regraded in the request, and nothing sent before the transaction committed.
        assert not GradingRun.objects.filter(trigger=RunTrigger.REGRADE).exists()
        assert sent == []
        for callback in callbacks:
            callback()
        assert sent == [regrade.pk]
        event = AuditEvent.objects.get(action="grading.lab_regrade_queued")
        assert (event.actor, event.course_id, event.data["attempts"]) == (instructor_a, lab.course_id, 2)

    def test_a_second_press_while_queued_queues_nothing_more(self, ta_a, shouted_lab, sent, press_regrade):
        lab, _other = shouted_lab
        press_regrade(ta_a, lab)
        response = press_regrade(ta_a, lab)
        assert "already queued" in [str(m) for m in get_messages(response.wsgi_request)][-1]
        assert LabRegrade.objects.filter(lab=lab).count() == 1
        assert len(sent) == 1

    def test_report_shows_the_outcome_once_the_task_ran(self, client, instructor_a, shouted_lab, sent, press_regrade):
        lab, _other = shouted_lab
        press_regrade(instructor_a, lab)
        page = client.get(reverse("grading:lab_report", args=[lab.pk])).content.decode()
        assert "Waiting for a worker (2 attempts)" in page
        tasks.lab_regrade_execute(sent[0])
        page = client.get(reverse("grading:lab_report", args=[lab.pk])).content.decode()
        assert "2 runs of 2 attempts re-evaluated; 0 running attempts checked again" in page

    @pytest.mark.parametrize("who", ["student_a", "instructor_b", "other_course_ta"])
    def test_others_get_404_and_nothing_is_queued(self, request, shouted_lab, sent, who, tenant_a, press_regrade):
        if who == "other_course_ta":
            from portal.models import Course

            course = Course.objects.create(tenant=tenant_a, code="SEC300", title="Security", term="2026 fall")
            person = make_person(username="ta_other", tenant=tenant_a, course=course, role=Role.TA)
        else:
            person = request.getfixturevalue(who)
        lab, _other = shouted_lab
        assert press_regrade(person, lab).status_code == 404
        assert not LabRegrade.objects.exists()
        assert sent == []

    def test_lab_of_another_tenant_is_not_found_for_its_staff_neighbours(self, client, instructor_a, lab_b, sent):
        client.force_login(instructor_a)
        assert post_regrade(client, lab_b).status_code == 404
        assert not LabRegrade.objects.exists()


class TestTask:
    def test_does_the_regrade_and_records_the_outcome(
        self, instructor_a, student_a, shouted_lab, sent, django_capture_on_commit_callbacks
    ):
        lab, other = shouted_lab
        with django_capture_on_commit_callbacks(execute=True):
            regrade, created = lab_regrade_request(actor=instructor_a, lab=lab)
        assert created
        assert tasks.lab_regrade_execute(regrade.pk) == RunState.DONE
        regrade.refresh_from_db()
        assert (regrade.attempts_regraded, regrade.runs_reevaluated, regrade.runs_queued) == (2, 2, 0)
        assert regrade.finished_at is not None
        for student in (student_a, other):
            assert Grade.objects.get(lab=lab, student=student).score == Decimal("3.00")
        assert set(GradingRun.objects.filter(trigger=RunTrigger.REGRADE).values_list("requested_by", flat=True)) == {
            instructor_a.pk
        }
        event = AuditEvent.objects.get(action="grading.lab_regraded")
        assert (event.actor, event.data["reevaluated_runs"]) == (instructor_a, 2)

    def test_a_redelivered_message_does_nothing(self, instructor_a, shouted_lab, sent):
        lab, _other = shouted_lab
        regrade, _created = lab_regrade_request(actor=instructor_a, lab=lab)
        assert tasks.lab_regrade_execute(regrade.pk) == RunState.DONE
        assert tasks.lab_regrade_execute(regrade.pk) == "skipped"
        assert GradingRun.objects.filter(trigger=RunTrigger.REGRADE).count() == 2
        assert AuditEvent.objects.filter(action="grading.lab_regraded").count() == 1

    def test_failure_halfway_changes_nothing_and_says_so(self, instructor_a, shouted_lab, sent, monkeypatch):
        from grading.services import regrades

        lab, _other = shouted_lab
        regrade, _created = lab_regrade_request(actor=instructor_a, lab=lab)
        real = regrades._reevaluate_run
        calls = []

        def second_one_breaks(**kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("database went away")
            return real(**kwargs)

        monkeypatch.setattr(regrades, "_reevaluate_run", second_one_breaks)
        with pytest.raises(RuntimeError):
            tasks.lab_regrade_execute(regrade.pk)
        regrade.refresh_from_db()
        assert regrade.state == RunState.ERROR
        assert "database went away" in regrade.error
        assert not GradingRun.objects.filter(trigger=RunTrigger.REGRADE).exists()  # rolled back as a whole

    def test_requester_who_left_the_course_staff_is_not_acted_for(self, ta_a, shouted_lab, sent):
        lab, _other = shouted_lab
        regrade, _created = lab_regrade_request(actor=ta_a, lab=lab)
        Membership.objects.filter(user=ta_a, course=lab.course).delete()
        assert tasks.lab_regrade_execute(regrade.pk) == RunState.ERROR
        regrade.refresh_from_db()
        assert "no longer course staff" in regrade.error
        assert not GradingRun.objects.filter(trigger=RunTrigger.REGRADE).exists()

    def test_running_attempts_are_checked_again_in_their_guest(self, instructor_a, student_a, lab_a, sent, monkeypatch):
        from grading.services import runs

        queued: list[int] = []
        monkeypatch.setattr(runs, "enqueue_run_on_commit", lambda *, run, checks: queued.append(run.pk))
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.RUNNING)
        record_run(attempt=attempt, outputs=SHOUTED)
        regrade, _created = lab_regrade_request(actor=instructor_a, lab=lab_a)
        assert regrade.attempts_requested == 1
        lab_regrade_execute(regrade_id=regrade.pk)
        regrade.refresh_from_db()
        assert (regrade.runs_reevaluated, regrade.runs_queued) == (1, 1)
        assert GradingRun.objects.filter(attempt=attempt, state=RunState.QUEUED, trigger=RunTrigger.REGRADE).exists()


class TestRequestService:
    def test_other_tenant_staff_get_not_found(self, instructor_b, lab_a, sent):
        with pytest.raises(NotFound):
            lab_regrade_request(actor=instructor_b, lab=lab_a)
        assert not LabRegrade.objects.exists()

    def test_a_queue_that_refuses_the_task_ends_the_regrade_in_error(
        self, instructor_a, lab_a, monkeypatch, django_capture_on_commit_callbacks
    ):
        def refuse(regrade_id):
            raise ConnectionError("broker down")

        monkeypatch.setattr(tasks.lab_regrade_execute, "delay", refuse)
        with django_capture_on_commit_callbacks(execute=True):
            regrade, _created = lab_regrade_request(actor=instructor_a, lab=lab_a)
        regrade.refresh_from_db()
        assert regrade.state == RunState.ERROR
        assert "broker down" in regrade.error

    def test_a_lost_message_goes_stale_and_a_new_request_is_accepted(self, instructor_a, lab_a, sent):
        from grading.services import regrades

        old, _created = lab_regrade_request(actor=instructor_a, lab=lab_a)
        later = timezone.now() + timedelta(seconds=regrades.QUEUED_STALE_SECONDS + 1)
        assert lab_regrades_fail_stale(now=later) == 1
        old.refresh_from_db()
        assert old.state == RunState.ERROR
        new, created = lab_regrade_request(actor=instructor_a, lab=lab_a)
        assert created and new.pk != old.pk
        assert tasks.lab_regrade_execute(old.pk) == "skipped"
