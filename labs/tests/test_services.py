"""The lifecycle services' rules, without the cluster: who may start, stop and extend, the clear refusals, the
status payload and tenant scoping. Provisioning is queued on commit, which these tests never reach."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conftest import make_lab, make_person
from labs.access import attempt_get_for_user, attempts_visible_to
from labs.models import Attempt, AttemptState
from labs.selectors import attempt_status_payload, tenant_capacity
from labs.services import attempt_expire, attempt_extend, attempt_start, attempt_stop
from portal.errors import Conflict, NotFound, PermissionDenied, Unavailable
from portal.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def running(attempt: Attempt, *, minutes_left: int = 30) -> Attempt:
    now = timezone.now()
    Attempt.objects.filter(id=attempt.id).update(
        state=AttemptState.RUNNING, agent_ready_at=now, expires_at=now + timedelta(minutes=minutes_left)
    )
    attempt.refresh_from_db()
    return attempt


def test_start_makes_a_requested_attempt_with_server_generated_names(student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    assert attempt.state == AttemptState.REQUESTED
    assert attempt.vm_name == f"attempt-{attempt.id}"
    assert attempt.namespace == lab_a.course.tenant.namespace
    assert len(attempt.agent_token) >= 40
    assert (attempt.vcpus, attempt.memory_mib) == (1, 2048)
    assert (attempt.launcher_cpu_millicores, attempt.launcher_memory_mib) == (105, 2354)
    assert attempt.number == 1
    event = AuditEvent.objects.get(action="attempt.start")
    assert (event.actor, event.target_id, event.course) == (student_a, str(attempt.id), lab_a.course)


def test_only_students_of_the_course_may_start(lab_a, ta_a, instructor_a, student_b, superuser):
    with pytest.raises(PermissionDenied):
        attempt_start(actor=ta_a, lab=lab_a)
    with pytest.raises(PermissionDenied):
        attempt_start(actor=instructor_a, lab=lab_a)
    with pytest.raises(NotFound):
        attempt_start(actor=student_b, lab=lab_a)  # another tenant: the lab does not exist for them
    with pytest.raises(PermissionDenied):
        attempt_start(actor=superuser, lab=lab_a)
    assert not Attempt.objects.exists()


def test_a_start_whose_caller_read_the_students_role_with_the_lab_does_not_read_it_again(student_a, lab_a, superuser):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from labs.access import lab_get_for_student, student_role_shown

    lab = lab_get_for_student(user=student_a, lab_id=lab_a.id)
    with CaptureQueriesContext(connection) as queries:
        attempt_start(actor=student_a, lab=lab, role=student_role_shown(user=student_a))
    assert not any("portal_membership" in query["sql"] for query in queries.captured_queries)
    # A superuser's lab came without a membership: the role is read, and only students start.
    assert student_role_shown(user=superuser) is None
    with pytest.raises(PermissionDenied):
        attempt_start(
            actor=superuser,
            lab=lab_get_for_student(user=superuser, lab_id=lab_a.id),
            role=student_role_shown(user=superuser),
        )


def test_a_closed_lab_says_when_it_opens(student_a, lab_a):
    lab_a.opens_at = timezone.now() + timedelta(days=2)
    lab_a.save()
    with pytest.raises(Conflict, match="This lab opens on") as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "lab_closed"
    lab_a.opens_at, lab_a.due_at = None, timezone.now() - timedelta(days=1)
    lab_a.save()
    with pytest.raises(Conflict, match="This lab is closed."):
        attempt_start(actor=student_a, lab=lab_a)


def test_one_active_attempt_per_student_and_lab(student_a, lab_a):
    first = attempt_start(actor=student_a, lab=lab_a)
    with pytest.raises(Conflict) as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "attempt_active" and refusal.value.extra == {"attempt_id": first.id}


def test_attempt_limit_counts_everything_but_failures(student_a, lab_a):
    lab_a.attempt_limit = 2
    lab_a.save()
    tenant = lab_a.course.tenant
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=tenant, state=AttemptState.FAILED, number=1)
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=tenant, state=AttemptState.STOPPED, number=2)
    second = attempt_start(actor=student_a, lab=lab_a)
    assert second.number == 3
    Attempt.objects.filter(id=second.id).update(state=AttemptState.EXPIRED)
    with pytest.raises(Conflict, match="You have used all 2 attempts for this lab.") as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "attempt_limit"


def test_quota_refusal_names_what_is_full_and_suggests_a_wait(tenant_a, course_a, student_a, lab_a):
    tenant_a.max_concurrent_vms, tenant_a.max_vcpus, tenant_a.max_memory_mib = 5, 2, 6000
    tenant_a.save()
    other = make_person(username="other", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    attempt_start(actor=other, lab=make_lab(course_a, title="Medium", size="medium"))  # 2 vCPUs, 4414 MiB held
    with pytest.raises(Unavailable) as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    error = refusal.value
    assert error.status_code == 503 and error.code == "quota_full" and 30 <= error.retry_after <= 60
    assert "2 of 2 vCPUs are in use" in error.message and "4414 of 6000 MiB of memory are in use" in error.message
    assert "lab VMs" not in error.message  # 1 of 5 VMs: only vCPUs and memory are short


def test_a_lab_larger_than_the_whole_quota_is_refused_without_a_wait(tenant_a, course_a, student_a, lab_a):
    tenant_a.max_concurrent_vms, tenant_a.max_vcpus, tenant_a.max_memory_mib = 5, 4, 6000
    tenant_a.save()
    large = make_lab(course_a, title="Large", size="large")  # 4 vCPUs, 8192 MiB guest
    with pytest.raises(Conflict) as refusal:
        attempt_start(actor=student_a, lab=large)
    error = refusal.value
    assert error.code == "quota_too_small" and error.retry_after is None
    assert "6000 MiB of memory, this lab needs 8" in error.message and "Ask your instructor" in error.message
    assert "vCPUs" not in error.message  # 4 of 4 fits; only memory is short
    # A small lab fits; a quota of no VMs at all fits nothing, and says so rather than that it is full.
    assert attempt_start(actor=student_a, lab=lab_a).state == AttemptState.REQUESTED
    tenant_a.max_concurrent_vms = 0
    tenant_a.save()
    other = make_person(username="other", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    with pytest.raises(Conflict, match="it allows no lab VMs"):
        attempt_start(actor=other, lab=lab_a)


def test_stopping_and_failed_attempts_do_and_do_not_hold_quota(tenant_a, course_a, lab_a, student_a):
    tenant_a.max_concurrent_vms = 1
    tenant_a.save()
    other = make_person(username="other", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    held = Attempt.objects.create(lab=lab_a, student=other, tenant=tenant_a, state=AttemptState.STOPPING)
    with pytest.raises(Unavailable):
        attempt_start(actor=student_a, lab=lab_a)  # a stopping VM still occupies the cluster
    Attempt.objects.filter(id=held.id).update(state=AttemptState.FAILED)
    assert attempt_start(actor=student_a, lab=lab_a)


def test_deployment_wide_start_throttle(settings, student_a, lab_a):
    settings.ATTEMPT_CONCURRENT_START_LIMIT = 1
    other_lab = make_lab(lab_a.course, title="Other")
    attempt_start(actor=student_a, lab=other_lab)
    with pytest.raises(Unavailable, match="Many labs are starting right now") as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "too_many_starts" and refusal.value.retry_after >= 30


def test_invalid_extra_cloud_init_is_refused_before_anything_is_made(student_a, lab_a):
    lab_a.extra_cloud_init = "- just\n- a list\n"
    lab_a.save()
    with pytest.raises(Conflict, match="This lab is misconfigured") as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "lab_misconfigured"
    assert not Attempt.objects.exists()


def test_stop_by_student_and_by_instructor_but_not_by_ta_or_other_tenant(
    student_a, instructor_a, ta_a, instructor_b, lab_a
):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    with pytest.raises(PermissionDenied):
        attempt_stop(actor=ta_a, attempt=attempt)
    with pytest.raises(NotFound):
        attempt_stop(actor=instructor_b, attempt=attempt)
    stopped = attempt_stop(actor=instructor_a, attempt=attempt)
    assert stopped.state == AttemptState.STOPPING and stopped.stop_reason == "staff"
    assert AuditEvent.objects.get(action="attempt.stop").actor == instructor_a
    # Stopping again changes nothing; stopping an ended attempt is refused.
    assert attempt_stop(actor=student_a, attempt=attempt).state == AttemptState.STOPPING
    assert AuditEvent.objects.filter(action="attempt.stop").count() == 1
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.STOPPED)
    with pytest.raises(Conflict, match="already ended"):
        attempt_stop(actor=student_a, attempt=attempt)


def test_extend_is_bounded_and_audited(settings, student_a, lab_a):
    settings.ATTEMPT_EXTEND_MINUTES, settings.ATTEMPT_MAX_EXTENSIONS = 15, 2
    attempt = attempt_start(actor=student_a, lab=lab_a)
    with pytest.raises(Conflict, match="Only a running lab can be extended."):
        attempt_extend(actor=student_a, attempt=attempt)
    attempt = running(attempt)
    expires = attempt.expires_at
    attempt = attempt_extend(actor=student_a, attempt=attempt)
    attempt = attempt_extend(actor=student_a, attempt=attempt)
    assert attempt.expires_at == expires + timedelta(minutes=30) and attempt.extensions == 2
    with pytest.raises(Conflict, match="already been extended 2 times") as refusal:
        attempt_extend(actor=student_a, attempt=attempt)
    assert refusal.value.code == "extension_limit"
    assert AuditEvent.objects.filter(action="attempt.extend", target_id=str(attempt.id)).count() == 2


def test_expire_only_acts_when_the_time_is_really_up(student_a, lab_a):
    attempt = running(attempt_start(actor=student_a, lab=lab_a), minutes_left=5)
    assert attempt_expire(attempt=attempt).state == AttemptState.RUNNING  # extended or not yet due
    Attempt.objects.filter(id=attempt.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = attempt_expire(attempt=attempt)
    assert expired.state == AttemptState.STOPPING and expired.stop_reason == "expired"


def test_status_payload_shape(settings, student_a, lab_a):
    settings.ATTEMPT_SLOW_START_NOTICE_SECONDS = 90
    attempt = attempt_start(actor=student_a, lab=lab_a)
    payload = attempt_status_payload(attempt)
    assert set(payload) == {
        "id",
        "state",
        "phase",
        "failure_reason",
        "message",
        "node_name",
        "expires_at",
        "extensions",
        "can_extend",
        "timestamps",
        "slow_start",
        "console",
        "stop_reason",
    }
    assert set(payload["timestamps"]) == {
        "requested",
        "provisioned",
        "pending",
        "scheduling",
        "scheduled",
        "vmi_running",
        "agent_ready",
        "stopping",
        "ended",
    }
    assert payload["timestamps"]["requested"] == attempt.requested_at.isoformat()
    assert payload["timestamps"]["vmi_running"] is None and payload["slow_start"] is False
    assert payload["console"] == "waiting"  # no VM yet: the page does not open the console socket
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.STARTING, phase="Scheduled")
    attempt.refresh_from_db()
    assert attempt_status_payload(attempt)["console"] == "waiting"
    Attempt.objects.filter(id=attempt.id).update(phase="Running")
    attempt.refresh_from_db()
    assert attempt_status_payload(attempt)["console"] == "ready"  # the VMI runs; the agent may not answer yet
    later = timezone.now() + timedelta(seconds=120)
    assert attempt_status_payload(attempt, now=later)["slow_start"] is True
    attempt = running(attempt)
    payload = attempt_status_payload(attempt)
    assert payload["can_extend"] is True and payload["expires_at"] == attempt.expires_at.isoformat()
    assert payload["console"] == "ready"
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.STOPPING)
    attempt.refresh_from_db()
    assert attempt_status_payload(attempt)["console"] == "ended"


def test_attempts_are_scoped_to_their_student_and_course_staff(
    student_a, ta_a, instructor_b, student_b, lab_a, course_a
):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    classmate = make_person(username="classmate", tenant=lab_a.course.tenant, course=course_a, role=Role.STUDENT)
    assert attempt_get_for_user(user=student_a, attempt_id=attempt.id) == attempt
    assert attempt_get_for_user(user=ta_a, attempt_id=attempt.id) == attempt
    for outsider in (classmate, instructor_b, student_b):
        with pytest.raises(NotFound):
            attempt_get_for_user(user=outsider, attempt_id=attempt.id)
        assert not attempts_visible_to(user=outsider).filter(id=attempt.id).exists()


def test_an_attempt_looked_up_without_its_relations_reads_its_own_row_only(student_a, ta_a, lab_a):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    attempt = attempt_start(actor=student_a, lab=lab_a)
    for user in (student_a, ta_a):  # the student's own attempt, and staff through the courses they teach
        with CaptureQueriesContext(connection) as queries:
            assert attempt_get_for_user(user=user, attempt_id=attempt.id, related=False) == attempt
        # The attempt's own columns only: other tables' columns cost far more to build into the query than the row
        # costs to read.
        columns = queries.captured_queries[-1]["sql"].split(" FROM ")[0].removeprefix("SELECT ").split(", ")
        assert {column.split(".")[0] for column in columns} == {'"labs_attempt"'}, columns
    with CaptureQueriesContext(connection) as queries:
        found = attempt_get_for_user(user=student_a, attempt_id=attempt.id)
        assert (found.lab.course, found.student, found.tenant) == (lab_a.course, student_a, lab_a.course.tenant)
    assert len(queries.captured_queries) == 1


def test_tenant_capacity_counts_launcher_requests(tenant_a, student_a, lab_a):
    attempt_start(actor=student_a, lab=lab_a)
    capacity = tenant_capacity(tenant=tenant_a)
    assert (capacity.active_vms, capacity.running_vms, capacity.vcpus) == (1, 0, 1)
    assert (capacity.cpu_millicores, capacity.memory_mib) == (105, 2354)
    assert capacity.max_cpu_millicores == 2000 + 5 * tenant_a.max_concurrent_vms  # and each VM's console log
