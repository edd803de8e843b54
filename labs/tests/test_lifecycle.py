"""An attempt's life against kubesim and PostgreSQL: start to running, stop, expiry, idempotent provisioning."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from labs import tasks
from labs.kubevirt import client, manifests, names, operations
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services import agents, attempt_start, attempt_stop, namespaces, provisioning, stopping, tracking
from labs.tests.conftest import sync_until, vm_names, wait_until
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


def start(student, lab, capture) -> Attempt:
    with capture(execute=True):
        return attempt_start(actor=student, lab=lab)


def test_start_reaches_running_with_every_phase_timestamp(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING
    assert attempt.vm_name == f"attempt-{attempt.id}" and attempt.namespace == lab_a.course.tenant.namespace
    assert attempt.provisioned_at is not None
    assert AuditEvent.objects.filter(action="attempt.start", target_id=str(attempt.id), actor=student_a).exists()

    sync_until(attempt, AttemptState.RUNNING)
    assert attempt.phase == "Running"
    assert attempt.node_name
    stamps = [
        attempt.requested_at,
        attempt.provisioned_at,
        attempt.pending_at,
        attempt.scheduling_at,
        attempt.scheduled_at,
        attempt.vmi_running_at,
        attempt.agent_ready_at,
    ]
    assert all(stamps), stamps
    assert attempt.pending_at <= attempt.scheduling_at <= attempt.scheduled_at <= attempt.vmi_running_at
    assert attempt.vmi_running_at <= attempt.agent_ready_at
    assert attempt.expires_at == attempt.agent_ready_at + timedelta(minutes=lab_a.time_limit_minutes)

    # What reached the cluster: the VM with our labels, its Secret owned by it, the namespace's guard rails.
    vm = operations.vm_get(namespace=attempt.namespace, name=attempt.vm_name)
    assert vm["spec"]["runStrategy"] == "Always"
    assert names.attempt_id_from_labels(vm["metadata"]["labels"]) == attempt.id
    secret = client.core_v1().read_namespaced_secret(names.cloud_init_secret_name(attempt.vm_name), attempt.namespace)
    assert [ref.name for ref in secret.metadata.owner_references] == [attempt.vm_name]
    policies = client.networking_v1().list_namespaced_network_policy(attempt.namespace).items
    assert {p.metadata.name for p in policies} == {names.DEFAULT_DENY_POLICY, names.AGENT_POLICY}
    quota = client.core_v1().read_namespaced_resource_quota(names.RESOURCE_QUOTA, attempt.namespace)
    assert quota.spec.hard["count/virtualmachines.kubevirt.io"] == str(lab_a.course.tenant.max_concurrent_vms)
    assert TenantNamespace.objects.get(namespace=attempt.namespace).bootstrapped_at is not None


def test_the_page_is_told_of_each_provisioning_step_as_the_database_has_it(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    from unittest import mock

    with mock.patch("labs.services.events.send_to_group") as send:
        attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    updates = [call for call in send.call_args_list if call.args[1]["type"] == "attempt.update"]
    pushed = [call.args[1]["attempt"] for call in updates]
    # Nothing as the attempt is created (nobody follows it yet: the Start's answer carries it), then each step.
    assert [update["state"] for update in pushed] == ["provisioning", "starting"]
    # The lab's class views are told of each step too.
    told = [call.args for call in send.call_args_list if call.args[1]["type"] == "class.changed"]
    assert told and all(group == f"class-{lab_a.id}" for group, _message in told)
    # "provisioning" is held back (sent only if no newer update of the attempt replaces it in time), "starting" not.
    assert [call.kwargs.get("hold", 0.0) for call in updates] == [
        provisioning.PROVISIONING_PUSH_HOLD_SECONDS,
        0.0,
    ]
    attempt.refresh_from_db()
    assert pushed[-1]["timestamps"]["provisioned"] == attempt.provisioned_at.isoformat()
    assert pushed[-1]["timestamps"]["requested"] == attempt.requested_at.isoformat()


def test_a_namespace_sync_reads_the_attempts_without_their_labs(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    with CaptureQueriesContext(connection) as queries:
        tracking.namespace_sync(namespace=attempt.namespace)
    # Every tracked attempt of the namespace, at every list: a lab's columns (its instructions among them) per row
    # would cost more than the rest of the row.
    # (An attempt whose agent answers during the sync is read back once, with its lab, for its page's update: a
    # single row, not the list.)
    reads = [
        query["sql"]
        for query in queries.captured_queries
        if query["sql"].startswith("SELECT") and not query["sql"].endswith("LIMIT 1")
    ]
    assert any('"labs_attempt"."vm_name"' in sql for sql in reads)
    assert not [sql for sql in reads if '"labs_lab".' in sql.split(" FROM ")[0]]


def test_stop_deletes_the_vm_and_ends_the_attempt(lifecycle, student_a, lab_a, django_capture_on_commit_callbacks):
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    sync_until(attempt, AttemptState.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        stopped = attempt_stop(actor=student_a, attempt=attempt)
    assert stopped.state == AttemptState.STOPPING and stopped.stop_reason == "student"
    attempt.refresh_from_db()
    assert attempt.vm_deleted_at is not None and attempt.final_grading_at is not None
    assert AuditEvent.objects.filter(action="attempt.stop", target_id=str(attempt.id)).exists()
    sync_until(attempt, AttemptState.STOPPED)
    assert attempt.ended_at is not None
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the VM to be gone")
    # The stop graded once more, through the agent, before the VM went.
    assert attempt.runs.filter(trigger="stop").count() == 1


def test_expiry_grades_once_more_then_deletes_the_vm(lifecycle, student_a, lab_a, django_capture_on_commit_callbacks):
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    sync_until(attempt, AttemptState.RUNNING)
    Attempt.objects.filter(id=attempt.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert stopping.attempts_expire_due() == 1
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPING and attempt.stop_reason == "expired"
    sync_until(attempt, AttemptState.EXPIRED)
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the VM to be gone")
    run = attempt.runs.get(trigger="expiry")
    assert run.state in ("done", "error")


def test_the_same_provision_delivered_twice_makes_one_vm(lifecycle, student_a, lab_a, eager_tasks):
    # No on-commit execution: provisioning is delivered by hand, twice, as a redelivering broker would.
    attempt = attempt_start(actor=student_a, lab=lab_a)
    assert tasks.provision_attempt(attempt.id) == "created"
    assert tasks.provision_attempt(attempt.id) == "skipped"
    # And a third delivery that finds the attempt still provisioning (the first one's update lost) converges.
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.PROVISIONING, provisioned_at=None)
    assert tasks.provision_attempt(attempt.id) == "created"
    assert vm_names(attempt.namespace) == [attempt.vm_name]
    attempt.refresh_from_db()
    # Starting again, or already running: the guest the first delivery made may answer the agent check that the
    # third delivery queues (eagerly, here) at once.
    assert attempt.state in (AttemptState.STARTING, AttemptState.RUNNING) and attempt.provisioned_at is not None


def test_a_vm_field_the_cluster_does_not_know_fails_the_attempt_instead_of_being_dropped(
    lifecycle, student_a, lab_a, monkeypatch
):
    # The API server's default is to drop an unknown field with a warning; the portal asks it to refuse instead,
    # so a misspelt (or newer-than-the-cluster) setting cannot silently go missing from a student's VM.
    make_vm = manifests.virtual_machine

    def misspelt(**kwargs):
        vm = make_vm(**kwargs)
        vm["spec"]["template"]["spec"]["domain"]["cpu"]["socketz"] = 1
        return vm

    monkeypatch.setattr(manifests, "virtual_machine", misspelt)
    attempt = attempt_start(actor=student_a, lab=lab_a)
    assert tasks.provision_attempt(attempt.id) == "failed"
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert 'unknown field "spec.template.spec.domain.cpu.socketz"' in attempt.failure_reason
    assert vm_names(attempt.namespace) == []


def test_a_worker_killed_mid_provision_converges_on_rerun(lifecycle, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    # The first worker claimed the attempt and created the Secret, then died before the VM.
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.PROVISIONING)
    namespaces.tenant_namespace_ensure(tenant=lab_a.course.tenant)
    from guest.cloud_init import render_user_data

    labels = names.attempt_labels(
        tenant_id=attempt.tenant_id, course_id=lab_a.course_id, lab_id=lab_a.id, attempt_id=attempt.id
    )
    operations.secret_create(
        manifests.cloud_init_secret(
            name=names.cloud_init_secret_name(attempt.vm_name),
            namespace=attempt.namespace,
            labels=labels,
            user_data=render_user_data(token=attempt.agent_token),
        )
    )
    assert vm_names(attempt.namespace) == []

    assert tasks.provision_attempt(attempt.id) == "created"
    assert vm_names(attempt.namespace) == [attempt.vm_name]
    sync_until(attempt, AttemptState.RUNNING)


def test_the_tenant_namespace_is_applied_once_until_its_objects_or_the_namespace_change(
    lifecycle, lab_a, django_assert_num_queries
):
    tenant = lab_a.course.tenant
    assert namespaces.tenant_namespace_ensure(tenant=tenant)
    with django_assert_num_queries(0):  # every later provision in this process: neither database nor cluster
        assert not namespaces.tenant_namespace_ensure(tenant=tenant)
    tenant.max_vcpus += 4  # the quota changed: applied again
    assert namespaces.tenant_namespace_ensure(tenant=tenant)
    quota = client.core_v1().read_namespaced_resource_quota(names.RESOURCE_QUOTA, tenant.namespace)
    assert (
        quota.spec.hard["requests.cpu"]
        == manifests.quota_hard(
            max_vms=tenant.max_concurrent_vms,
            max_vcpus=tenant.max_vcpus,
            max_memory_mib=tenant.max_memory_mib,
        )["requests.cpu"]
    )
    assert not namespaces.tenant_namespace_ensure(tenant=tenant)
    # Deleted behind the portal's back: a create answers 404 and provisioning forces the objects again.
    client.core_v1().delete_namespace(tenant.namespace)
    wait_until(lambda: tenant.namespace not in {ns.metadata.name for ns in client.core_v1().list_namespace().items})
    assert namespaces.tenant_namespace_ensure(tenant=tenant, force=True)
    assert client.core_v1().read_namespace(tenant.namespace).metadata.name == tenant.namespace


def test_a_vm_created_but_never_recorded_is_picked_up_by_the_sync(lifecycle, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    tasks.provision_attempt(attempt.id)
    # As if the worker died after creating the VM and before recording it.
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.PROVISIONING, provisioned_at=None)
    sync_until(attempt, AttemptState.RUNNING)
    assert attempt.provisioned_at is not None


def test_stopping_before_provisioning_ran_ends_without_a_vm(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = attempt_start(actor=student_a, lab=lab_a)  # provisioning never delivered (callbacks not run)
    with django_capture_on_commit_callbacks(execute=True):
        attempt_stop(actor=student_a, attempt=attempt)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPED
    # The late provisioning delivery does nothing.
    assert tasks.provision_attempt(attempt.id) == "skipped"
    assert vm_names(attempt.namespace) == []


def test_an_agent_that_answers_before_any_list_gets_its_phase_times_from_a_prompt_list(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks, monkeypatch, settings
):
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    settings.ATTEMPT_FOLLOW_UP_SECONDS = (0.05, 0.3)
    wait_until(
        lambda: any(
            vmi["metadata"]["name"] == attempt.vm_name and (vmi.get("status") or {}).get("phase") == "Running"
            for vmi in operations.vmis_list(namespace=attempt.namespace)
        ),
        what="the VMI running",
    )
    # The fast path: the agent answers while the attempt still shows no phase (no list has seen the VMI yet).
    listed: list[str] = []
    monkeypatch.setattr(
        tasks.sync_namespace, "apply_async", lambda *, args, kwargs, countdown, expires: listed.append(args[0])
    )
    asked: list[int] = []
    monkeypatch.setattr(agents, "_agent_answers", lambda attempt: asked.append(attempt.id) or True)
    # A VM made a moment ago is not asked yet (no guest can be up): only from AGENT_ASK_MIN_SECONDS on.
    Attempt.objects.filter(id=attempt.id).update(provisioned_at=timezone.now())
    assert agents.agents_check(namespace=attempt.namespace) == (0, 1) and asked == []
    Attempt.objects.filter(id=attempt.id).update(
        provisioned_at=timezone.now() - timedelta(seconds=agents.AGENT_ASK_MIN_SECONDS)
    )
    assert agents.agents_check(namespace=attempt.namespace) == (1, 0) and asked == [attempt.id]
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.vmi_running_at is None
    assert listed == [attempt.namespace]  # a list is queued at once, not left to the resync
    # That list records the VMI's phase times for the page's progress.
    wait_until(
        lambda: (
            tracking.namespace_sync(namespace=attempt.namespace),
            attempt.refresh_from_db(),
            attempt.vmi_running_at is not None,
        )[-1],
        what="the VMI's phase times",
    )
    assert attempt.phase == "Running" and attempt.scheduled_at and attempt.vmi_running_at <= attempt.agent_ready_at
