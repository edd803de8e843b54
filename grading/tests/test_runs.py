"""The run flow without a guest: the Check button's rules, claiming, failures, the final run and stale runs."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from conftest import make_person
from grading.models import Grade, GradingRun, RunState, RunTrigger
from grading.selectors import grading_run_payload
from grading.services import (
    grading_run_execute,
    grading_run_final,
    grading_run_request,
    grading_runs_fail_stale,
)
from grading.tests.builders import ALL_PASS, FIRST_ONLY, make_attempt, record_run
from labs.kubevirt import client as kube_client
from labs.models import AttemptState
from portal.errors import ApplicationError, Conflict, NotFound
from portal.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_cluster(settings, tmp_path, monkeypatch):
    """The portal configured with a kubeconfig that does not exist: every agent call fails before the network."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.KUBECONFIG = str(tmp_path / "missing-kubeconfig")
    kube_client.reset()
    yield
    kube_client.reset()


class TestCheckButton:
    def test_owner_queues_a_run_and_the_task_waits_for_commit(
        self, lab_a, student_a, django_capture_on_commit_callbacks
    ):
        attempt = make_attempt(lab=lab_a, student=student_a)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            run = grading_run_request(actor=student_a, attempt=attempt)
        assert run.state == RunState.QUEUED
        assert run.trigger == RunTrigger.STUDENT
        assert run.requested_by == student_a
        assert len(callbacks) == 2  # the Celery task and the browser push
        event = AuditEvent.objects.get(action="grading.run_requested")
        assert (event.actor, event.course, event.data["run_id"]) == (student_a, lab_a.course, run.pk)

    def test_course_staff_may_check_a_students_attempt(self, lab_a, student_a, ta_a):
        run = grading_run_request(actor=ta_a, attempt=make_attempt(lab=lab_a, student=student_a))
        assert run.trigger == RunTrigger.STAFF

    def test_other_students_and_other_tenants_get_not_found(self, lab_a, student_a, tenant_a, course_a, instructor_b):
        attempt = make_attempt(lab=lab_a, student=student_a)
        classmate = make_person(username="classmate", tenant=tenant_a, course=course_a, role=Role.STUDENT)
        for actor in (classmate, instructor_b):
            with pytest.raises(NotFound):
                grading_run_request(actor=actor, attempt=attempt)
        assert not GradingRun.objects.exists()

    @pytest.mark.parametrize("state", [AttemptState.STARTING, AttemptState.STOPPING, AttemptState.EXPIRED])
    def test_attempt_must_be_running(self, lab_a, student_a, state):
        attempt = make_attempt(lab=lab_a, student=student_a, state=state)
        with pytest.raises(Conflict) as caught:
            grading_run_request(actor=student_a, attempt=attempt)
        assert caught.value.code == "attempt_not_running"
        assert not GradingRun.objects.exists()

    def test_one_unfinished_run_per_attempt(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        first = grading_run_request(actor=student_a, attempt=attempt)
        with pytest.raises(Conflict) as caught:
            grading_run_request(actor=student_a, attempt=attempt)
        assert caught.value.extra == {"run_id": first.pk}
        assert GradingRun.objects.count() == 1

    def test_minimum_interval_between_runs(self, lab_a, student_a, settings):
        settings.GRADING_MIN_INTERVAL_SECONDS = 30
        attempt = make_attempt(lab=lab_a, student=student_a)
        previous = record_run(attempt=attempt, outputs=FIRST_ONLY)
        with pytest.raises(ApplicationError) as caught:
            grading_run_request(actor=student_a, attempt=attempt)
        assert caught.value.status_code == 429
        assert 1 <= caught.value.retry_after <= 30
        GradingRun.objects.filter(pk=previous.pk).update(created_at=timezone.now() - timedelta(seconds=31))
        assert grading_run_request(actor=student_a, attempt=attempt).state == RunState.QUEUED

    def test_a_stale_queued_run_no_longer_blocks(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        stuck = GradingRun.objects.create(attempt=attempt, state=RunState.QUEUED)
        GradingRun.objects.filter(pk=stuck.pk).update(created_at=timezone.now() - timedelta(hours=1))
        run = grading_run_request(actor=student_a, attempt=attempt)
        stuck.refresh_from_db()
        assert (stuck.state, stuck.error_code) == (RunState.ERROR, "interrupted")
        assert run.state == RunState.QUEUED

    def test_lab_without_checks(self, lab_a, student_a):
        lab_a.checks.all().delete()
        with pytest.raises(ApplicationError) as caught:
            grading_run_request(actor=student_a, attempt=make_attempt(lab=lab_a, student=student_a))
        assert caught.value.code == "no_checks"


class TestExecution:
    def test_agent_trouble_ends_the_run_in_error_without_touching_the_grade(self, lab_a, student_a, no_cluster):
        attempt = make_attempt(lab=lab_a, student=student_a)
        record_run(attempt=attempt, outputs=ALL_PASS, measured_at=timezone.now() - timedelta(minutes=5))
        run = GradingRun.objects.create(attempt=attempt, state=RunState.QUEUED)
        finished = grading_run_execute(run_id=run.pk)
        assert finished.state == RunState.ERROR
        assert finished.error_code == "cluster_unavailable"
        assert "missing-kubeconfig, which does not exist" in finished.error
        assert finished.score is None
        assert finished.results.count() == 0
        assert Grade.objects.get(lab=lab_a, student=student_a).score == 3
        assert grading_run_payload(finished)["error"] == "The cluster could not be reached. Try again later."

    def test_redelivered_task_does_nothing(self, lab_a, student_a, no_cluster):
        run = GradingRun.objects.create(attempt=make_attempt(lab=lab_a, student=student_a), state=RunState.QUEUED)
        grading_run_execute(run_id=run.pk)
        assert grading_run_execute(run_id=run.pk) is None

    def test_attempt_that_stopped_before_the_worker_came(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        run = GradingRun.objects.create(attempt=attempt, state=RunState.QUEUED)
        attempt.state = AttemptState.STOPPED
        attempt.save(update_fields=["state"])
        finished = grading_run_execute(run_id=run.pk)
        assert (finished.state, finished.error_code) == (RunState.ERROR, "attempt_not_running")

    def test_running_run_past_its_deadline_is_failed_by_the_sweep(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        run = GradingRun.objects.create(
            attempt=attempt, state=RunState.RUNNING, started_at=timezone.now() - timedelta(minutes=5)
        )
        fresh = GradingRun.objects.create(
            attempt=make_attempt(
                lab=lab_a,
                student=make_person(username="s2", tenant=lab_a.course.tenant, course=lab_a.course, role=Role.STUDENT),
            ),
            state=RunState.RUNNING,
            started_at=timezone.now(),
        )
        assert grading_runs_fail_stale() == 1
        run.refresh_from_db()
        fresh.refresh_from_db()
        assert (run.state, fresh.state) == (RunState.ERROR, RunState.RUNNING)


class TestFinalRun:
    def test_nothing_to_grade_without_a_ready_agent(self, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a, agent_ready_at=None)
        assert grading_run_final(attempt=attempt, trigger=RunTrigger.EXPIRY) is None
        assert not GradingRun.objects.exists()

    def test_agent_trouble_is_recorded_not_raised_and_a_queued_run_is_replaced(self, lab_a, student_a, no_cluster):
        attempt = make_attempt(lab=lab_a, student=student_a, agent_ready_at=timezone.now())
        queued = GradingRun.objects.create(attempt=attempt, state=RunState.QUEUED)
        run = grading_run_final(attempt=attempt, trigger=RunTrigger.EXPIRY)
        assert run.trigger == RunTrigger.EXPIRY
        assert (run.state, run.error_code) == (RunState.ERROR, "cluster_unavailable")
        queued.refresh_from_db()
        assert (queued.state, queued.error_code) == (RunState.ERROR, "replaced_by_final_run")

    def test_only_expiry_or_stop(self, lab_a, student_a):
        with pytest.raises(ValueError):
            grading_run_final(attempt=make_attempt(lab=lab_a, student=student_a), trigger=RunTrigger.STUDENT)


class TestPayloadAndPush:
    def test_payload_is_json_safe_and_carries_no_output(self, lab_a, student_a):
        run = record_run(attempt=make_attempt(lab=lab_a, student=student_a), outputs=FIRST_ONLY)
        payload = json.loads(json.dumps(grading_run_payload(run)))
        assert payload["state"] == "done"
        assert (payload["score"], payload["max_score"], payload["effective_score"]) == (1.0, 3.0, 1.0)
        assert [r["passed"] for r in payload["results"]] == [True, False]
        assert payload["results"][1]["feedback"] == "The file must contain the words hello world."
        assert "goodbye" not in json.dumps(payload)

    def test_update_reaches_the_attempt_group_after_commit(self, lab_a, student_a, django_capture_on_commit_callbacks):
        attempt = make_attempt(lab=lab_a, student=student_a)
        layer = get_channel_layer()
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(f"attempt-{attempt.pk}", channel)
        try:
            with django_capture_on_commit_callbacks(execute=True):
                run = record_run(attempt=attempt, outputs=ALL_PASS)
            message = async_to_sync(layer.receive)(channel)
        finally:
            async_to_sync(layer.group_discard)(f"attempt-{attempt.pk}", channel)
        assert message["type"] == "grading.update"
        assert message["run"]["id"] == run.pk
        assert message["run"]["score"] == 3.0
        # One payload per language, for each socket to forward its page's; ``run`` is the default language's.
        assert set(message["runs"]) == {code for code, _name in settings.LANGUAGES}
        assert message["runs"][settings.LANGUAGE_CODE] == message["run"]
