"""Writes through the API: start, stop, extend, check and grade overrides. Server-owned fields cannot be set,
other tenants' objects are 404 and unchanged, and the rate limits answer 429 with Retry-After."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conftest import make_person
from grading.models import Grade, GradingRun
from labs.models import Attempt, AttemptState
from portal.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


def counts() -> dict[str, int]:
    return {
        "attempts": Attempt.objects.count(),
        "runs": GradingRun.objects.count(),
        "grades": Grade.objects.count(),
        "audit": AuditEvent.objects.count(),
    }


def test_start_creates_a_requested_attempt_with_server_generated_names(lab_a, client_for, student_a):
    response = client_for(student_a).post("/api/v1/attempts/", {"lab": lab_a.id}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == AttemptState.REQUESTED and body["student"]["username"] == "student_a"
    attempt = Attempt.objects.get(id=body["id"])
    assert attempt.vm_name == f"attempt-{attempt.id}"
    assert attempt.namespace == lab_a.course.tenant.namespace
    assert attempt.agent_token and attempt.agent_token not in response.content.decode()
    assert AuditEvent.objects.filter(action="attempt.start", target_id=str(attempt.id)).exists()


@pytest.mark.parametrize(
    "field,value",
    [
        ("state", "running"),
        ("student", 999),
        ("tenant", 1),
        ("vm_name", "kube-apiserver"),
        ("namespace", "kube-system"),
        ("agent_token", "x"),
        ("score", 100),
        ("id", 5),
        ("number", 7),
    ],
)
def test_start_refuses_server_owned_fields_and_creates_nothing(lab_a, client_for, student_a, field, value):
    before = counts()
    response = client_for(student_a).post("/api/v1/attempts/", {"lab": lab_a.id, field: value}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {field: ["This field cannot be set."]}
    assert counts() == before


def test_start_on_another_tenants_lab_is_404_and_creates_nothing(world, client_for, student_a):
    before = counts()
    response = client_for(student_a).post("/api/v1/attempts/", {"lab": world.lab_b.id}, format="json")
    assert response.status_code == 404
    assert counts() == before


@pytest.mark.parametrize("body", [{}, {"lab": "abc"}, {"lab": -1}, {"lab": 2**70}, [], "lab"])
def test_start_with_bad_input_is_400(lab_a, client_for, student_a, body):
    before = counts()
    response = client_for(student_a).post("/api/v1/attempts/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] in {"invalid", "parse_error"}
    assert counts() == before


def test_service_refusals_come_through_in_the_error_format(world, client_for, student_a, ta_a):
    # student_a already has a running attempt of lab_a: the lifecycle refuses a second one with 409.
    response = client_for(student_a).post("/api/v1/attempts/", {"lab": world.lab_a.id}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "attempt_active"
    assert response.json()["error"]["details"] == {"attempt_id": world.attempt_a.id}
    response = client_for(ta_a).post("/api/v1/attempts/", {"lab": world.lab_a.id}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_starts_are_rate_limited_per_user_with_retry_after(lab_a, client_for, student_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    client = client_for(student_a)
    assert client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json").status_code == 201
    assert client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json").status_code == 409
    before = counts()
    refused = client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limited" and "Wait" in error["message"]
    assert 0 < error["retry_after"] <= 600 and refused["Retry-After"] == str(error["retry_after"])
    assert counts() == before


def test_stop_and_extend_by_the_student(world, client_for, student_a):
    client = client_for(student_a)
    attempt = world.attempt_a
    Attempt.objects.filter(id=attempt.id).update(expires_at=timezone.now() + timedelta(minutes=30))
    assert client.get(f"/api/v1/attempts/{attempt.id}/").json()["can_extend"] is True
    extended = client.post(f"/api/v1/attempts/{attempt.id}/extend/", format="json")
    assert extended.status_code == 200, extended.content
    assert extended.json()["extensions"] == 1
    stopped = client.post(f"/api/v1/attempts/{attempt.id}/stop/", format="json")
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["state"] in {AttemptState.STOPPING, AttemptState.STOPPED}
    actions = set(AuditEvent.objects.filter(target_id=str(attempt.id)).values_list("action", flat=True))
    assert {"attempt.extend", "attempt.stop"} <= actions


@pytest.mark.parametrize("action", ["stop", "extend", "check"])
def test_actions_on_another_tenants_attempt_are_404_and_change_nothing(
    world, client_for, student_a, instructor_b, action
):
    before = counts()
    state_before = Attempt.objects.get(id=world.attempt_b.id).state
    for user, attempt in ((student_a, world.attempt_b), (instructor_b, world.attempt_a)):
        response = client_for(user).post(f"/api/v1/attempts/{attempt.id}/{action}/", format="json")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert counts() == before
    assert Attempt.objects.get(id=world.attempt_b.id).state == state_before


@pytest.mark.parametrize("action", ["stop", "extend", "check"])
def test_actions_refuse_a_body_that_tries_to_set_fields(world, client_for, student_a, action):
    before = counts()
    response = client_for(student_a).post(
        f"/api/v1/attempts/{world.attempt_a.id}/{action}/", {"state": "stopped", "score": 3}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"state", "score"}
    assert counts() == before
    assert Attempt.objects.get(id=world.attempt_a.id).state == AttemptState.RUNNING


def test_actions_refuse_a_body_that_is_not_an_object(world, client_for, student_a):
    response = client_for(student_a).post(f"/api/v1/attempts/{world.attempt_a.id}/stop/", [1], format="json")
    assert response.status_code == 400
    assert Attempt.objects.get(id=world.attempt_a.id).state == AttemptState.RUNNING


def test_check_queues_a_run_then_refuses_with_the_reason(world, client_for, student_a, settings):
    settings.GRADING_MIN_INTERVAL_SECONDS = 0
    GradingRun.objects.filter(attempt=world.attempt_a).delete()
    client = client_for(student_a)
    response = client.post(f"/api/v1/attempts/{world.attempt_a.id}/check/", format="json")
    assert response.status_code == 202, response.content
    run = response.json()
    assert run["state"] == "queued" and run["attempt"] == world.attempt_a.id
    again = client.post(f"/api/v1/attempts/{world.attempt_a.id}/check/", format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "run_in_progress"
    assert again.json()["error"]["details"] == {"run_id": run["id"]}


def test_checks_are_rate_limited_per_attempt(world, client_for, student_a, ta_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_check": (1, 600)}
    settings.GRADING_MIN_INTERVAL_SECONDS = 0
    GradingRun.objects.filter(attempt=world.attempt_a).delete()
    assert client_for(student_a).post(f"/api/v1/attempts/{world.attempt_a.id}/check/").status_code == 202
    GradingRun.objects.filter(attempt=world.attempt_a).update(state="done")
    before = counts()
    # The limit belongs to the attempt: staff pressing Check on it count towards the same limit.
    refused = client_for(ta_a).post(f"/api/v1/attempts/{world.attempt_a.id}/check/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"]["code"] == "rate_limited"
    assert counts() == before


def test_check_interval_from_grading_is_a_429_with_retry_after(world, client_for, student_a, settings):
    settings.GRADING_MIN_INTERVAL_SECONDS = 300
    response = client_for(student_a).post(f"/api/v1/attempts/{world.attempt_a.id}/check/")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_soon"
    assert 0 < int(response["Retry-After"]) <= 300


def test_refused_attempt_of_another_tenant_does_not_use_up_its_check_limit(
    world, client_for, student_a, student_b, settings
):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_check": (1, 600)}
    settings.GRADING_MIN_INTERVAL_SECONDS = 0
    for _ in range(3):
        assert client_for(student_b).post(f"/api/v1/attempts/{world.attempt_a.id}/check/").status_code == 404
    GradingRun.objects.filter(attempt=world.attempt_a).delete()
    assert client_for(student_a).post(f"/api/v1/attempts/{world.attempt_a.id}/check/").status_code == 202


def test_grade_override_by_staff_is_audited(world, client_for, ta_a):
    response = client_for(ta_a).post(
        f"/api/v1/grades/{world.grade_a.id}/override/",
        {"score": "2.50", "reason": "Regrade after review"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["final_score"] == "2.50" and response.json()["is_overridden"] is True
    assert AuditEvent.objects.filter(action="grading.override_set", course=world.course_a).exists()


def test_grade_override_refusals(world, client_for, student_a, instructor_b, ta_a):
    before = counts()
    body = {"score": "3", "reason": "because"}
    own = client_for(student_a).post(f"/api/v1/grades/{world.grade_a.id}/override/", body, format="json")
    assert own.status_code == 403
    other = client_for(instructor_b).post(f"/api/v1/grades/{world.grade_a.id}/override/", body, format="json")
    assert other.status_code == 404
    sneaky = client_for(ta_a).post(
        f"/api/v1/grades/{world.grade_a.id}/override/",
        {**body, "student": world.grade_b.student_id},
        format="json",
    )
    assert sneaky.status_code == 400 and "student" in sneaky.json()["error"]["fields"]
    too_high = client_for(ta_a).post(
        f"/api/v1/grades/{world.grade_a.id}/override/", {"score": "99", "reason": "x"}, format="json"
    )
    assert too_high.status_code == 400 and too_high.json()["error"]["code"] == "invalid_score"
    assert counts() == before
    assert Grade.objects.get(id=world.grade_a.id).override_score is None


def test_a_full_capacity_refusal_is_not_counted_against_the_start_limit(lab_a, client_for, student_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (1, 600)}
    tenant = lab_a.course.tenant
    tenant.max_concurrent_vms = 1  # held by a classmate's lab
    tenant.save(update_fields=["max_concurrent_vms"])
    holder = make_person(username="holder", tenant=tenant, course=lab_a.course, role=Role.STUDENT)
    Attempt.objects.create(lab=lab_a, student=holder, tenant=tenant, state=AttemptState.RUNNING)
    client = client_for(student_a)
    for _try in range(3):
        refused = client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "quota_full"
    tenant.max_concurrent_vms = 10
    tenant.save(update_fields=["max_concurrent_vms"])
    assert client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json").status_code == 201
    assert client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json").status_code == 429
