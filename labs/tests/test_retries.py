"""Transient cluster errors: provisioning retries through 503s and gives up with the cluster's words; a failing
list in one namespace does not stop the sync of the others; the agent-check pacing, and an agent ready only once its
guest has set the lab up."""

from __future__ import annotations

from datetime import timedelta

import pytest

from labs import tasks
from labs.models import Attempt, AttemptState
from labs.services import agents, attempt_start, attempt_stop, tracking
from labs.tests.conftest import sync_until, vm_names

pytestmark = pytest.mark.django_db


@pytest.fixture
def faults(lifecycle):
    from portal.celery import app

    # Eager retries run at once inside apply(), but only when the Retry is not propagated to the caller.
    app.conf.task_eager_propagates = False
    yield lifecycle.admin
    app.conf.task_eager_propagates = True
    lifecycle.admin.clear_faults()


def test_provisioning_retries_through_a_503(faults, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    faults.inject_fault(code=503, verbs=["create"], resources=["virtualmachines"], count=2)
    result = tasks.provision_attempt.delay(attempt.id)  # eager: retries run at once, backoff skipped
    assert result.get() == "created"
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING
    assert vm_names(attempt.namespace) == [attempt.vm_name]


def test_provisioning_gives_up_with_the_clusters_words(faults, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    faults.inject_fault(code=500, verbs=["create"], resources=["virtualmachines"])
    assert tasks.provision_attempt.delay(attempt.id).get() == "failed"
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure_reason.startswith("The cluster did not accept the lab's VM (creating VM")
    assert vm_names(attempt.namespace) == []


def test_a_direct_call_raises_the_transient_error_for_the_caller(faults, student_a, lab_a):
    from labs.kubevirt.operations import ClusterError

    attempt = attempt_start(actor=student_a, lab=lab_a)
    faults.inject_fault(code=429, verbs=["create"], resources=["secrets"], count=1, retry_after=2)
    with pytest.raises(ClusterError) as raised:
        tasks.provision_attempt(attempt.id)
    assert raised.value.transient and raised.value.status == 429 and raised.value.retry_after == 2
    assert tasks.provision_attempt(attempt.id) == "created"  # the rerun converges


def test_a_failing_namespace_is_reported_and_the_sync_goes_on(faults, student_a, lab_a, student_b, lab_b):
    first = attempt_start(actor=student_a, lab=lab_a)
    second = attempt_start(actor=student_b, lab=lab_b)
    tasks.provision_attempt(first.id)
    tasks.provision_attempt(second.id)
    faults.inject_fault(code=503, verbs=["list"], resources=["virtualmachineinstances"], count=1)
    report = tracking.attempts_sync()
    assert len(report.errors) == 1
    assert "listing virtualmachineinstances in" in report.errors[0]
    assert "unable to handle the request" in report.errors[0]
    # The other namespace was listed and its attempt moved on.
    assert len(report.namespaces) == 1
    failed_namespace = first.namespace if first.namespace in report.errors[0] else second.namespace
    from labs.models import TenantNamespace

    assert TenantNamespace.objects.get(namespace=failed_namespace).last_error == report.errors[0]


def test_backoff_is_capped_and_honours_retry_after():
    assert 1.0 <= tasks.backoff_seconds(0) <= 1.25
    assert 8.0 <= tasks.backoff_seconds(3) <= 10.0
    assert 60.0 <= tasks.backoff_seconds(20) <= 75.0
    assert tasks.backoff_seconds(0, retry_after=30) == 30


def test_agent_checks_are_quick_at_first_then_at_the_sync_pace(settings):
    settings.ATTEMPT_SYNC_INTERVAL_SECONDS = 3
    delays = [agents.agent_wait_delay(step) for step in range(40)]
    assert delays[0] == 0.2 and delays[14] == 0.2 and delays[15] == 0.5 and delays[21] == 1.0
    assert delays[-1] == 3.0 and max(delays) == 3.0


def asked_rounds(
    *, round_seconds: float = 0.2, until: float = 120.0, min_gap: float = agents.AGENT_ASK_MIN_SECONDS
) -> list[float]:
    """The ages at which a chain of rounds every ``round_seconds`` asks an agent, up to ``until``."""
    asked, age, previous = [], 0.0, None
    while age <= until:
        since = None if previous is None else age - previous
        if agents.agent_ask_due(booting_for=age, since_last_round=since, min_gap=min_gap):
            asked.append(age)
        previous, age = age, round(age + round_seconds, 6)
    return asked


def test_booting_agents_are_asked_less_often_the_longer_they_take(settings):
    settings.ATTEMPT_SYNC_INTERVAL_SECONDS = 3
    asked = asked_rounds()
    assert asked[:5] == [0.0, 0.2, 0.4, 0.6, 0.8]  # a fast guest is noticed within a round
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:], strict=False)]
    assert max(gaps) <= 3.0 + 0.2  # never further apart than the sync interval (and a round)
    assert len(asked) < 60  # two minutes of a guest that never answers: 600 rounds, a few dozen questions
    # Whenever a guest comes up, it is asked within a quarter of its boot time (or 0.2 s), plus a round.
    for up_at in (0.1, 0.7, 2.0, 5.5, 13.0, 40.0, 100.0):
        first = next(age for age in asked if age >= up_at)
        assert first - up_at <= min(3.0, max(0.2, up_at / 4)) + 0.2, (up_at, first)


def test_a_chain_asks_only_the_agents_due_and_counts_the_rest_as_waiting(student_a, lab_a, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from labs.models import Attempt

    attempt = attempt_start(actor=student_a, lab=lab_a)
    booted = timezone.now() - timedelta(seconds=30)
    Attempt.objects.filter(id=attempt.id).update(
        state=AttemptState.STARTING, phase="Running", provisioned_at=booted, vmi_running_at=booted
    )
    asked = []
    monkeypatch.setattr(agents, "_agent_answers", lambda attempt: asked.append(attempt.id) or False)
    # Its last question was just now (30 s into the boot, the next one is about 7 s away): not asked again.
    assert agents.agents_check(namespace=attempt.namespace, since_last_round=0.2) == (0, 1)
    assert asked == []
    # A chain's first round asks every booting agent.
    assert agents.agents_check(namespace=attempt.namespace) == (0, 1)
    assert asked == [attempt.id]


def test_an_agent_answering_before_its_guest_has_set_up_the_lab_is_not_ready_yet(student_a, lab_a, monkeypatch):
    from django.utils import timezone

    attempt = attempt_start(actor=student_a, lab=lab_a)
    booted = timezone.now() - timedelta(seconds=30)
    Attempt.objects.filter(id=attempt.id).update(
        state=AttemptState.STARTING, phase="Running", provisioned_at=booted, vmi_running_at=booted
    )
    # cloud-init starts the agent, then runs the lab's own commands: the agent says when they are done.
    health = {"ready": True, "version": "1.0.0", "setup_finished": False}
    monkeypatch.setattr(agents, "healthz", lambda target, timeout_s: health)
    assert agents.agents_check(namespace=attempt.namespace) == (0, 1)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING and attempt.agent_ready_at is None
    health["setup_finished"] = True
    assert agents.agents_check(namespace=attempt.namespace) == (1, 0)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING


def test_the_more_agents_boot_together_the_further_apart_each_is_asked(settings):
    settings.ATTEMPT_SYNC_INTERVAL_SECONDS = 3
    assert agents.agent_ask_gap(1) == agents.agent_ask_gap(8) == agents.AGENT_ASK_MIN_SECONDS
    gap = agents.agent_ask_gap(100)
    assert gap == 100 / agents.AGENT_ASK_RATE_PER_SECOND == 2.5
    alone, in_a_class = asked_rounds(until=10.0), asked_rounds(until=10.0, min_gap=gap)
    assert len(alone) >= 12 and len(in_a_class) <= 5  # the first ten seconds of a guest that does not answer
    gaps = [later - earlier for earlier, later in zip(in_a_class, in_a_class[1:], strict=False)]
    assert min(gaps) >= 2.5 - 0.2 and max(gaps) <= 3.0 + 0.2  # give or take a round; still once per sync interval
    # The namespace's questions a second, 100 agents asked over their first minute: near the rate, not 500.
    per_agent = len(asked_rounds(until=60.0, min_gap=gap)) / 60.0
    assert 100 * per_agent <= agents.AGENT_ASK_RATE_PER_SECOND


def test_a_round_asks_a_class_booting_together_less_often(student_a, lab_a, course_a, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from conftest import make_person
    from labs.models import Attempt
    from portal.models import Role

    namespace = course_a.tenant.namespace

    def booting(count: int) -> None:
        Attempt.objects.filter(namespace=namespace).delete()
        for index in range(count):
            student = make_person(
                username=f"class-{count}-{index}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT
            )
            Attempt.objects.create(
                lab=lab_a,
                student=student,
                tenant=course_a.tenant,
                namespace=namespace,
                vm_name=f"attempt-{count}-{index}",
                state=AttemptState.STARTING,
                phase="Running",
            )
        # One second into their boot as of now, however long making the people took (each hashes a password).
        booted = timezone.now() - timedelta(seconds=1)
        Attempt.objects.filter(namespace=namespace).update(provisioned_at=booted, vmi_running_at=booted)

    asked = []
    monkeypatch.setattr(agents, "_agent_answers", lambda attempt: asked.append(attempt.id) or False)
    # One second into their boot, the previous round 0.2 s ago: a few agents are due (one every 0.2 s early on)...
    booting(4)
    assert agents.agents_check(namespace=namespace, since_last_round=0.2) == (0, 4)
    assert len(asked) == 4
    # ...a class of 100 was asked at 0 s and is next due at 2.5 s: none is asked this round.
    asked.clear()
    booting(100)
    assert agents.agents_check(namespace=namespace, since_last_round=0.2) == (0, 100)
    assert asked == []


def test_a_round_reads_the_waiting_attempts_in_one_query_with_all_it_asks_with(
    student_a, lab_a, course_a, monkeypatch, django_assert_num_queries
):
    from datetime import timedelta

    from django.utils import timezone

    from conftest import make_person
    from labs.models import Attempt
    from portal.models import Role

    booted = timezone.now() - timedelta(seconds=1)
    namespace = course_a.tenant.namespace
    for index in range(5):
        student = make_person(username=f"round-{index}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
        Attempt.objects.create(
            lab=lab_a,
            student=student,
            tenant=course_a.tenant,
            namespace=namespace,
            vm_name=f"attempt-round-{index}",
            agent_token=f"token-{index}",
            state=AttemptState.STARTING,
            phase="Running",
            provisioned_at=booted,
            vmi_running_at=booted,
        )
    asked = []
    # What the agent client reads to reach the agent (labs.agent_client.agent_request): each a loaded field, so
    # asking a hundred agents costs no query each.
    monkeypatch.setattr(
        agents,
        "_agent_answers",
        lambda attempt: asked.append((attempt.namespace, attempt.vm_name, attempt.agent_token)),
    )
    with django_assert_num_queries(1):
        assert agents.agents_check(namespace=namespace) == (0, 5)
    assert sorted(asked) == [(namespace, f"attempt-round-{index}", f"token-{index}") for index in range(5)]


def test_a_teardown_cut_off_by_an_outage_resumes_on_the_first_sync_that_reaches_the_cluster(
    faults, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    tasks.provision_attempt(attempt.id)
    faults.inject_fault(code=503)  # the cluster stops answering anything
    with django_capture_on_commit_callbacks(execute=True) as queued:
        attempt_stop(actor=student_a, attempt=Attempt.objects.get(pk=attempt.pk))  # eager teardown: retries fail
    assert len(queued) >= 1
    assert tracking.attempts_sync().errors  # the outage lasts a sync or two
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPING and attempt.vm_deleted_at is None

    faults.clear_faults()
    with django_capture_on_commit_callbacks(execute=True):
        tracking.attempts_sync()  # the cluster answers: the teardown goes on now, not at a later retry or sweep
    attempt.refresh_from_db()
    assert attempt.vm_deleted_at is not None
    assert vm_names(attempt.namespace) == []
    sync_until(attempt, AttemptState.STOPPED, timeout=10)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        tracking.attempts_sync()
    assert queued == []  # only the pass that found the cluster back resumes anything


def test_a_namespace_without_the_portals_role_reads_as_a_course_not_ready(faults, student_a, lab_a):
    # A new tenant whose Role a cluster admin has not applied yet: RBAC refuses the namespace's objects.
    attempt = attempt_start(actor=student_a, lab=lab_a)
    faults.inject_fault(code=403, verbs=["create"], resources=["networkpolicies", "secrets"])
    assert tasks.provision_attempt.delay(attempt.id).get() == "failed"
    attempt.refresh_from_db()
    assert attempt.failure_reason.startswith("This course is not ready yet")
    assert "tell your instructor" in attempt.failure_reason.lower()
    assert attempt.failure_reason_texts["ja"]


def _starts(student, lab) -> tuple:
    """The Start's answers: the lab page's (its script's, and a form's without script) and the API's."""
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(student)
    url = reverse("labs:attempt_start", kwargs={"lab_id": lab.id})
    script = client.post(url, HTTP_ACCEPT="application/json")
    form = client.post(url, follow=True)
    api = client.post("/api/v1/attempts/", {"lab": lab.id}, content_type="application/json")
    return script, form, api


def test_a_course_known_not_ready_refuses_the_start_before_any_attempt_and_starts_once_the_role_is_applied(
    faults, student_a, lab_a
):
    from labs.models import TenantNamespace
    from labs.services import namespaces, sweeping
    from portal.errors import Conflict

    faults.inject_fault(code=403, verbs=["list"], resources=["virtualmachines"])
    sweeping.attempts_sweep()  # a new tenant, never started: the sweep finds RBAC refusing the portal
    row = TenantNamespace.objects.get(tenant=lab_a.course.tenant)
    assert "is forbidden" in row.last_error and "tenant_manifests" in row.last_error  # the capacity page's words
    with pytest.raises(Conflict) as refused:
        attempt_start(actor=student_a, lab=lab_a)
    assert refused.value.code == "course_not_ready"
    assert str(refused.value.message) == "This course is not ready yet; your instructor has been told."
    script, form, api = _starts(student_a, lab_a)
    assert script.status_code == 409 and script.json() == {
        "error": str(refused.value.message),
        "code": "course_not_ready",
    }
    assert form.status_code == 200 and "This course is not ready yet" in form.content.decode()
    assert api.status_code == 409 and api.json()["error"]["code"] == "course_not_ready"
    assert Attempt.objects.count() == 0  # nothing failed: nothing was made

    faults.clear_faults()  # a cluster admin applies the tenant's manifests
    with pytest.raises(Conflict):  # known for a while yet: not asked again at every Start
        attempt_start(actor=student_a, lab=lab_a)
    TenantNamespace.objects.filter(pk=row.pk).update(
        last_error_at=row.last_error_at - timedelta(seconds=namespaces.NOT_READY_RECHECK_SECONDS + 1)
    )
    attempt = attempt_start(actor=student_a, lab=lab_a)  # checked again: the namespace is set up now
    assert TenantNamespace.objects.get(pk=row.pk).last_error == ""
    assert tasks.provision_attempt(attempt.id) == "created"


def test_a_provisioning_refused_by_rbac_makes_the_next_start_refused_rather_than_failed(
    faults, student_a, tenant_a, course_a, lab_a
):
    from conftest import make_person
    from portal.errors import Conflict
    from portal.models import Role

    student_b = make_person(username="student_a2", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    first = attempt_start(actor=student_a, lab=lab_a)
    faults.inject_fault(code=403, verbs=["create"], resources=["networkpolicies", "secrets", "virtualmachines"])
    assert tasks.provision_attempt.delay(first.id).get() == "failed"
    with pytest.raises(Conflict) as refused:
        attempt_start(actor=student_b, lab=lab_a)
    assert refused.value.code == "course_not_ready"
    assert list(Attempt.objects.values_list("student_id", flat=True)) == [student_a.id]
