"""Timers with a controlled clock: the time limit (expiry with its final grading), extensions, and the start
timeout (a VM that never runs is failed and deleted, its quota freed). ``django.utils.timezone.now`` is shifted
by the test; every timer lives in the database and is judged by the sync and the sweep, never by a Celery
countdown, so moving the clock is all it takes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings

from grading.models import GradingRun, RunState
from labs import tasks
from labs.models import ACTIVE_STATES, Attempt, AttemptState
from labs.services import agents, attempt_extend, attempt_start, sweeping, tracking
from labs.tests.reliability import (
    clock_fixture,
    cluster_fixture,
    drive_to,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    vm_names,
    wait_until,
)
from portal.errors import Conflict, Unavailable

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


kubesim = kubesim_fixture("timers")
cluster = cluster_fixture()
clock = clock_fixture()


def running(student, lab) -> Attempt:
    attempt = attempt_start(actor=student, lab=lab)
    assert tasks.provision_attempt(attempt.id) == "created"
    return drive_to(attempt, AttemptState.RUNNING)


def expire_due() -> int:
    return tracking.attempts_sync().expired


def test_expiry_at_the_time_limit_grades_once_more_then_deletes_the_vm(cluster, clock):
    lab = make_lab(make_course(make_tenant("Timers Expiry")), time_limit_minutes=60)
    (student,) = make_students(lab.course, 1)
    attempt = running(student, lab)
    assert attempt.expires_at == attempt.agent_ready_at + timedelta(minutes=60)

    clock.advance(minutes=59, seconds=58)
    assert expire_due() == 0
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.RUNNING

    clock.advance(seconds=3)
    assert expire_due() == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason) == (AttemptState.STOPPING, "expired")
    assert tasks.teardown_attempt(attempt.id) == "deleted"  # the task the expiry queued
    drive_to(attempt, AttemptState.EXPIRED)
    final = GradingRun.objects.get(attempt=attempt)
    assert (final.trigger, final.state) == ("expiry", RunState.DONE)
    wait_until(lambda: vm_names(attempt.namespace) == [], timeout=20, what="the VM to go")
    assert not Attempt.objects.filter(tenant=attempt.tenant, state__in=ACTIVE_STATES).exists()


def test_an_extension_moves_the_deadline_and_the_limit_on_extensions_holds(cluster, clock):
    lab = make_lab(make_course(make_tenant("Timers Extension")), time_limit_minutes=60)
    (student,) = make_students(lab.course, 1)
    attempt = running(student, lab)
    extend = settings.ATTEMPT_EXTEND_MINUTES

    clock.advance(minutes=50)
    for _ in range(settings.ATTEMPT_MAX_EXTENSIONS):
        attempt = attempt_extend(actor=student, attempt=attempt)
    with pytest.raises(Conflict) as refused:
        attempt_extend(actor=student, attempt=attempt)
    assert refused.value.code == "extension_limit"
    deadline_minutes = 60 + extend * settings.ATTEMPT_MAX_EXTENSIONS

    clock.advance(minutes=10, seconds=5)  # the original time limit has passed
    assert expire_due() == 0
    clock.advance(minutes=deadline_minutes - 60 - 1)  # a minute before the extended one
    assert expire_due() == 0
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.RUNNING
    clock.advance(minutes=1, seconds=5)
    assert expire_due() == 1
    assert tasks.teardown_attempt(attempt.id) == "deleted"
    drive_to(attempt, AttemptState.EXPIRED)


def test_a_start_that_never_runs_fails_at_the_start_timeout_and_frees_the_quota(cluster, clock, settings):
    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 24 * 3600  # only the start timeout may decide here
    tenant = make_tenant("Timers Start Timeout", vms=1)
    course = make_course(tenant)
    broken = make_lab(course, title="Unpullable")
    broken.image = "quay.io/containerdisks/missing:1"  # kubesim cannot pull it: the VMI never runs
    broken.save(update_fields=["image"])
    working = make_lab(course, title="Working")
    (student, classmate) = make_students(course, 2)
    stuck = attempt_start(actor=student, lab=broken)
    assert tasks.provision_attempt(stuck.id) == "created"
    wait_until(
        lambda: "could not be downloaded" in (drive_to(stuck, AttemptState.STARTING).status_message or ""),
        timeout=20,
        what="the image pull problem to show",
    )
    # The quota is held while it tries: the tenant's single VM slot is taken.
    with pytest.raises(Unavailable) as full:
        attempt_start(actor=classmate, lab=working)
    assert full.value.code == "quota_full"

    timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
    clock.advance(seconds=timeout - 30)
    assert sweeping.attempts_sweep().timed_out == []
    clock.advance(seconds=31)
    assert sweeping.attempts_sweep().timed_out == [stuck.id]
    stuck.refresh_from_db()
    assert stuck.state == AttemptState.FAILED
    assert stuck.failure_reason.startswith(f"The VM did not start within {timeout // 60} minutes.")
    assert "ErrImagePull" in stuck.failure_reason or "could not be downloaded" in stuck.failure_reason
    assert tasks.teardown_attempt(stuck.id) == "cleaned"  # the clean-up the failure queued
    wait_until(lambda: vm_names(tenant.namespace) == [], timeout=20, what="the stuck VM to be deleted")

    # The slot is free again.
    later = attempt_start(actor=classmate, lab=working)
    assert later.state == AttemptState.REQUESTED


def test_no_timer_waits_on_a_celery_countdown_past_the_visibility_timeout():
    # Redis redelivers a message whose countdown outlives the visibility timeout, again and again. Time limits,
    # start timeouts and redeliveries are judged from the database by the beat; only short retries and follow-up
    # listings use countdowns, and every one of them stays far below it.
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    from kubernetes.client.exceptions import ApiException

    from labs.kubevirt import operations

    asked = ApiException(status=503, reason="Service Unavailable")
    asked.headers = {"Retry-After": str(10**6)}  # an API server asking for eleven days
    retry_after = operations.cluster_error(asked, doing="creating VM").retry_after
    countdowns = [tasks.backoff_seconds(n, retry_after) for n in range(tasks.MAX_RETRIES + 1)]
    countdowns += [agents.agent_wait_delay(step) for step in range(agents.agent_wait_max_steps() + 1)]
    countdowns += list(settings.ATTEMPT_FOLLOW_UP_SECONDS)
    countdowns += [entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()]
    assert max(countdowns) < visibility / 10, max(countdowns)
