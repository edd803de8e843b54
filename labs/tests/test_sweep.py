"""The sweep, both ways: VMs nobody owns are deleted (only ours), attempts whose VM vanished or never started
fail with a reason, stopping attempts end, and lost tasks are queued again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from labs import tasks
from labs.kubevirt import client, manifests, names, operations
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services import attempt_start, sweeping, tenant_namespace_ensure
from labs.tests.conftest import sync_until, vm_names, wait_until

pytestmark = pytest.mark.django_db


def provisioned(student, lab) -> Attempt:
    attempt = attempt_start(actor=student, lab=lab)
    assert tasks.provision_attempt(attempt.id) == "created"
    attempt.refresh_from_db()
    return attempt


def foreign_vm(namespace: str, name: str, labels: dict[str, str]) -> None:
    body = manifests.virtual_machine(
        name=name,
        namespace=namespace,
        labels=labels,
        image="quay.io/x/y:1",
        vcpus=1,
        memory_mib=512,
        host_passthrough=False,
        cloud_init_secret="none",
    )
    body["spec"]["runStrategy"] = "Halted"  # a stopped VM: no guest needed to prove it is left alone
    client.custom_objects().create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", body)


def sweep(capture) -> sweeping.SweepReport:
    with capture(execute=True):
        return sweeping.attempts_sweep()


def test_orphan_vms_are_deleted_and_nothing_without_our_labels_is_touched(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = provisioned(student_a, lab_a)
    namespace = attempt.namespace
    # The database says the attempt ended, but its VM is still there (a lost teardown, a restored backup).
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.STOPPED, ended_at=timezone.now())
    # A VM of ours for an attempt this database never had.
    ghost_labels = names.attempt_labels(tenant_id=attempt.tenant_id, course_id=1, lab_id=1, attempt_id=999999)
    foreign_vm(namespace, "attempt-999999", ghost_labels)
    # Not ours: no label, someone else's manager, and our label on a name that does not match its attempt.
    foreign_vm(namespace, "teacher-demo", {"app": "demo"})
    foreign_vm(namespace, "attempt-999998", {names.MANAGED_BY_LABEL: "someone-else", names.ATTEMPT_LABEL: "999998"})
    foreign_vm(namespace, "hand-made", {**ghost_labels, names.ATTEMPT_LABEL: "999997"})

    report = sweep(django_capture_on_commit_callbacks)

    assert sorted(report.orphan_vms_deleted) == sorted(
        [f"{namespace}/{attempt.vm_name}", f"{namespace}/attempt-999999"]
    )
    remaining = client.custom_objects().list_namespaced_custom_object(
        "kubevirt.io", "v1", namespace, "virtualmachines"
    )["items"]
    # "hand-made" carries our manager label, but its name names no attempt of its label: left alone too.
    wait_until(lambda: vm_names(namespace) == ["hand-made"], what="our orphans to go")
    assert {"teacher-demo", "attempt-999998", "hand-made"} <= {vm["metadata"]["name"] for vm in remaining}
    secret = names.cloud_init_secret_name(attempt.vm_name)
    assert secret not in {s["metadata"]["name"] for s in operations.secrets_list(namespace=namespace)}
    attempt.refresh_from_db()
    assert attempt.vm_deleted_at is not None
    for name in ("teacher-demo", "attempt-999998", "hand-made"):
        client.custom_objects().delete_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", name)


def test_an_active_attempt_whose_vm_vanished_fails_with_a_reason(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = provisioned(student_a, lab_a)
    sync_until(attempt, AttemptState.RUNNING)
    operations.vm_delete(namespace=attempt.namespace, name=attempt.vm_name)  # someone ran kubectl delete vm
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the VM to go")
    report = sweep(django_capture_on_commit_callbacks)
    assert report.vanished == [attempt.id]
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure_reason == "The VM was deleted outside the portal."


def test_an_attempt_stuck_starting_fails_with_the_clusters_reason_and_is_cleaned_up(
    lifecycle, settings, student_a, course_a, django_capture_on_commit_callbacks
):
    from conftest import make_lab

    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 3600  # the sync alone would wait; the start timeout decides
    lab = make_lab(course_a, title="Unpullable")
    lab.image = "quay.io/containerdisks/missing:1"
    lab.save(update_fields=["image"])
    attempt = provisioned(student_a, lab)

    def image_trouble_seen() -> bool:
        sync_until(attempt, AttemptState.STARTING)
        return "could not be downloaded" in attempt.status_message

    wait_until(image_trouble_seen, timeout=60, what="the image pull problem")
    Attempt.objects.filter(id=attempt.id).update(requested_at=timezone.now() - timedelta(minutes=11), status_message="")
    lifecycle.admin.reset_counters()

    report = sweep(django_capture_on_commit_callbacks)
    assert report.timed_out == [attempt.id]
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure_reason.startswith("The VM did not start within 10 minutes. The cluster says:")
    # The VM's own status, read for this attempt alone (the sweep's list holds metadata only). kubelet flips
    # between the two within a second or two, so a slow run reads either.
    assert "(ErrImagePull)" in attempt.failure_reason or "(ImagePullBackOff)" in attempt.failure_reason
    assert lifecycle.admin.counters()["by_verb_resource"].get("get virtualmachines") == 1
    wait_until(lambda: vm_names(attempt.namespace) == [], timeout=60, what="the stuck VM to be deleted")


def test_a_stopping_attempt_whose_vm_is_gone_ends_and_frees_its_quota(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = provisioned(student_a, lab_a)
    operations.vm_delete(namespace=attempt.namespace, name=attempt.vm_name)
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the VM to go")
    Attempt.objects.filter(id=attempt.id).update(
        state=AttemptState.STOPPING, stop_reason="student", stopping_at=timezone.now(), vm_deleted_at=timezone.now()
    )
    report = sweep(django_capture_on_commit_callbacks)
    assert report.ended == [attempt.id]
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPED and attempt.ended_at is not None


def test_lost_provisioning_is_queued_again(lifecycle, student_a, lab_a, django_capture_on_commit_callbacks):
    attempt = attempt_start(actor=student_a, lab=lab_a)  # its provisioning message never arrived
    Attempt.objects.filter(id=attempt.id).update(requested_at=timezone.now() - timedelta(minutes=5))
    report = sweep(django_capture_on_commit_callbacks)
    assert report.requeued == [attempt.id]
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING
    assert vm_names(attempt.namespace) == [attempt.vm_name]


def test_the_sync_brings_the_sweep_forward_for_an_orphan_and_a_vanished_vm(
    lifecycle, student_a, lab_a, course_a, django_capture_on_commit_callbacks
):
    from conftest import make_lab
    from labs.services import tracking

    running = provisioned(student_a, lab_a)
    sync_until(running, AttemptState.RUNNING)
    orphan = provisioned(student_a, make_lab(course_a, title="Second lab"))
    Attempt.objects.filter(id=orphan.id).update(state=AttemptState.STOPPED)  # its VM outlived it
    with django_capture_on_commit_callbacks(execute=True):
        report = tracking.namespace_sync(namespace=running.namespace)
    assert report.sweep_requested
    wait_until(lambda: vm_names(running.namespace) == [running.vm_name], what="the orphan to be deleted")

    # Now the running attempt's VM is deleted behind the portal's back; once the VMI has been missing a while,
    # the next list asks for a sweep, which fails the attempt (the periodic sweep is a minute away).
    operations.vm_delete(namespace=running.namespace, name=running.vm_name)
    wait_until(lambda: vm_names(running.namespace) == [], what="the VM to go")
    Attempt.objects.filter(id=running.id).update(provisioned_at=timezone.now() - timedelta(minutes=1))
    from django.core.cache import cache

    cache.delete(tracking.SWEEP_SOON_KEY.format(namespace=running.namespace))
    with django_capture_on_commit_callbacks(execute=True):
        assert tracking.namespace_sync(namespace=running.namespace).sweep_requested
    running.refresh_from_db()
    assert running.state == AttemptState.FAILED
    assert running.failure_reason == "The VM was deleted outside the portal."


def test_idle_tenants_and_secrets_are_swept_less_often(
    lifecycle, tenant_a, tenant_b, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = provisioned(student_a, lab_a)  # tenant A is busy, tenant B has never had an attempt
    counters = lifecycle.admin
    counters.reset_counters()
    first = sweep(django_capture_on_commit_callbacks)
    assert first.namespaces == 2
    first_counts = counters.counters()["by_verb_resource"]
    assert first_counts.get("list virtualmachines") == 2 and first_counts.get("list secrets") == 2

    counters.reset_counters()
    second = sweep(django_capture_on_commit_callbacks)
    assert second.namespaces == 1  # only the busy tenant
    second_counts = counters.counters()["by_verb_resource"]
    assert second_counts.get("list virtualmachines") == 1 and "list secrets" not in second_counts
    assert vm_names(attempt.namespace) == [attempt.vm_name]  # and nothing of the busy tenant was disturbed


def test_vms_and_secrets_are_listed_by_their_metadata_only(lifecycle, student_a, lab_a):
    """A cloud-init Secret holds the whole lab agent, a VM its spec and status; the sweep reads names, labels and
    deletion marks, so that is all it asks for (PartialObjectMetadataList), and all the cluster sends."""
    attempt = provisioned(student_a, lab_a)
    [secret] = operations.secrets_list(namespace=attempt.namespace)
    assert set(secret) == {"kind", "apiVersion", "metadata"} and secret["kind"] == "PartialObjectMetadata"
    assert secret["metadata"]["name"] == names.cloud_init_secret_name(attempt.vm_name)
    assert names.attempt_id_from_labels(secret["metadata"]["labels"]) == attempt.id
    [vm] = operations.vms_list(namespace=attempt.namespace)
    assert set(vm) == {"kind", "apiVersion", "metadata"} and vm["kind"] == "PartialObjectMetadata"
    assert vm["metadata"]["name"] == attempt.vm_name and vm["metadata"]["uid"]
    assert names.attempt_id_from_labels(vm["metadata"]["labels"]) == attempt.id


def test_an_idle_namespace_swept_cleanly_forgets_a_failure_that_passed_but_not_a_refusal(cluster, tenant_a):
    """The error is what tells the tenant's students the cluster is away, and no sync lists an idle namespace."""
    tenant_namespace_ensure(tenant=tenant_a)
    rows = TenantNamespace.objects.filter(tenant=tenant_a)
    rows.update(last_error="listing virtualmachines: Internal error occurred", last_error_at=timezone.now())
    sweeping.namespace_sweep_now(namespace=tenant_a.namespace)
    assert rows.get().last_error == ""

    refusal = f'virtualmachines.kubevirt.io is forbidden: User "portal" cannot list in "{tenant_a.namespace}"'
    rows.update(last_error=refusal)  # the review in tenant_namespace_ready clears it
    sweeping.namespace_sweep_now(namespace=tenant_a.namespace)
    assert rows.get().last_error == refusal
