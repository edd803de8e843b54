"""Attempt admin: stop and extend actions go through the services (audited), and the capacity page shows each
tenant's use against its quota, to its instructors only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from conftest import PASSWORD
from labs.models import Attempt, AttemptState
from labs.services import attempt_start
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:labs_attempt_changelist"


def running_attempt(student, lab) -> Attempt:
    attempt = attempt_start(actor=student, lab=lab)
    now = timezone.now()
    Attempt.objects.filter(id=attempt.id).update(
        state=AttemptState.RUNNING, agent_ready_at=now, expires_at=now + timedelta(minutes=20)
    )
    attempt.refresh_from_db()
    return attempt


def act(client, user, action, attempt):
    client.login(username=user.username, password=PASSWORD)
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [attempt.id]}, follow=True)


def test_instructor_stops_an_attempt_from_the_admin(client, instructor_a, student_a, lab_a):
    attempt = running_attempt(student_a, lab_a)
    response = act(client, instructor_a, "stop_attempts", attempt)
    assert response.status_code == 200
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPING and attempt.stop_reason == "staff"
    assert AuditEvent.objects.filter(action="attempt.stop", actor=instructor_a, target_id=str(attempt.id)).exists()
    assert "Attempts being stopped: 1." in response.content.decode()


def test_instructor_extends_and_sees_the_refusal_past_the_limit(client, settings, instructor_a, student_a, lab_a):
    settings.ATTEMPT_MAX_EXTENSIONS = 1
    attempt = running_attempt(student_a, lab_a)
    expires = attempt.expires_at
    extended = act(client, instructor_a, "extend_attempts", attempt)
    assert f"Attempts given {settings.ATTEMPT_EXTEND_MINUTES} more minutes: 1." in extended.content.decode()
    attempt.refresh_from_db()
    assert attempt.extensions == 1
    assert attempt.expires_at == expires + timedelta(minutes=settings.ATTEMPT_EXTEND_MINUTES)
    response = act(client, instructor_a, "extend_attempts", attempt)
    assert "already been extended 1 times" in response.content.decode()
    assert AuditEvent.objects.filter(action="attempt.extend", actor=instructor_a).count() == 1


def test_another_tenants_instructor_cannot_act_on_the_attempt(client, instructor_b, student_a, lab_a):
    attempt = running_attempt(student_a, lab_a)
    act(client, instructor_b, "stop_attempts", attempt)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING
    assert not AuditEvent.objects.filter(action="attempt.stop").exists()


def test_capacity_page_shows_only_the_instructors_tenant(client, instructor_a, student_a, lab_a, tenant_b):
    running_attempt(student_a, lab_a)
    client.login(username=instructor_a.username, password=PASSWORD)
    response = client.get(reverse("admin:labs_attempt_capacity"))
    body = response.content.decode()
    assert response.status_code == 200
    assert lab_a.course.tenant.name in body and tenant_b.name not in body
    # One small VM: 2 GiB guest + 272 MiB launcher overhead + the console log sidecar's 35M, rounded up.
    assert "2354 MiB / 262144 MiB" in body
    assert '<td class="running-vms">1</td>' in body
    changelist = client.get(reverse(CHANGELIST)).content.decode()
    assert reverse("admin:labs_attempt_capacity") in changelist


def test_capacity_page_is_refused_to_non_instructors(client, instructor_b, ta_a):
    client.login(username=ta_a.username, password=PASSWORD)
    assert client.get(reverse("admin:labs_attempt_capacity")).status_code == 302  # not staff: to the login


def test_capacity_page_says_what_to_apply_when_the_portal_lacks_the_tenants_role(
    lifecycle, client, instructor_a, tenant_a, student_a, lab_a
):
    # lifecycle first: it sets the fast password hasher the personas must be made with to log in.
    from labs.services import tenant_namespace_ensure, tracking

    tenant_namespace_ensure(tenant=tenant_a)
    attempt = attempt_start(actor=student_a, lab=lab_a)
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.STARTING)
    lifecycle.admin.inject_fault(code=403, verbs=["list"], resources=["virtualmachineinstances"])
    try:
        tracking.attempts_sync()
    finally:
        lifecycle.admin.clear_faults()
    client.login(username=instructor_a.username, password=PASSWORD)
    body = client.get(reverse("admin:labs_attempt_capacity")).content.decode()
    assert "is forbidden" in body
    assert "python manage.py tenant_manifests" in body and "kubectl apply -f -" in body
    assert f'As a cluster admin, run: python manage.py tenant_manifests "{tenant_a.name}" | kubectl apply -f -' in body
