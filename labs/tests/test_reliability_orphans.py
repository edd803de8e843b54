"""Orphans both ways, swept by the real beat and worker within two sweep periods: a VM of ours that no attempt
owns, a VM the database says has ended (a lost teardown), and a running attempt whose VM vanished; and an expired
attempt deleted within two sync periods of its deadline. Objects without the portal's label are never touched."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from labs.kubevirt import client as kube_client
from labs.kubevirt import manifests, names, operations
from labs.models import Attempt, AttemptState
from labs.services import attempt_start, attempt_stop
from labs.tests.reliability import (
    PortalProcesses,
    agreement,
    flush_redis,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    portal_pointed_at,
    vm_names,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SYNC_SECONDS = 1
SWEEP_SECONDS = 3
# Beyond the periods: the pass itself, the beat's own tick granularity and this test's polling, each of them
# several times slower on a loaded machine; still far below the default sweep period (60 s).
SLACK_SECONDS = 4.0
# Behind the backlog the teardown term is measured instead, and the slack stays narrow: a pass that waited for
# the whole backlog (four teardowns per process) must not fit in it.
BACKLOG_SLACK_SECONDS = 1.5


kubesim = kubesim_fixture("orphans")


@pytest.fixture
def portal(kubesim, settings, tmp_path, transactional_db):
    flush_redis()
    with portal_pointed_at(kubesim, settings):
        processes = PortalProcesses(
            directory=tmp_path / "processes",
            kubeconfig=kubesim.kubeconfig,
            concurrency=3,
            env_overrides={
                "ATTEMPT_SYNC_INTERVAL_SECONDS": str(SYNC_SECONDS),
                "ATTEMPT_SWEEP_INTERVAL_SECONDS": str(SWEEP_SECONDS),
            },
        )
        processes.start()
        yield processes
        processes.stop()
    flush_redis()


def halted_vm(namespace: str, name: str, labels: dict[str, str]) -> None:
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
    body["spec"]["runStrategy"] = "Halted"
    kube_client.custom_objects().create_namespaced_custom_object(
        "kubevirt.io", "v1", namespace, "virtualmachines", body
    )


def seconds_until(predicate, *, limit: float, what: str, portal: PortalProcesses) -> float:
    started = time.monotonic()
    wait_until(predicate, timeout=limit + 60, interval=0.05, what=what, describe=portal.log_tail)
    return time.monotonic() - started


def test_orphans_both_ways_are_swept_within_two_sweep_periods(portal):
    tenant = make_tenant("Orphans University", vms=6)
    lab = make_lab(make_course(tenant))
    attempts = [attempt_start(actor=s, lab=lab) for s in make_students(lab.course, 4)]
    wait_until(
        lambda: all(Attempt.objects.get(pk=a.pk).state == AttemptState.RUNNING for a in attempts),
        timeout=60,
        what="attempts to run",
        describe=portal.log_tail,
    )
    kept, lost_teardown, vanished, expiring = attempts
    namespace = tenant.namespace
    labels = names.attempt_labels(tenant_id=tenant.id, course_id=lab.course_id, lab_id=lab.id, attempt_id=999999)

    # At one moment: a VM of ours for an attempt this database never had; a database that says an attempt ended
    # while its VM runs on; a VM deleted behind the portal's back; and a time limit running out.
    halted_vm(namespace, "attempt-999999", labels)
    halted_vm(namespace, "teacher-demo", {"app": "demo"})  # not ours: must survive
    Attempt.objects.filter(pk=lost_teardown.pk).update(state=AttemptState.STOPPED, ended_at=timezone.now())
    operations.vm_delete(namespace=namespace, name=vanished.vm_name)
    Attempt.objects.filter(pk=expiring.pk).update(expires_at=timezone.now())

    sweep_limit = 2 * SWEEP_SECONDS + SLACK_SECONDS
    orphan = seconds_until(
        lambda: "attempt-999999" not in vm_names(namespace),
        limit=sweep_limit,
        what="the unknown VM to be deleted",
        portal=portal,
    )
    leftover = seconds_until(
        lambda: lost_teardown.vm_name not in vm_names(namespace),
        limit=sweep_limit,
        what="the ended attempt's VM to be deleted",
        portal=portal,
    )
    gone = seconds_until(
        lambda: Attempt.objects.get(pk=vanished.pk).state == AttemptState.FAILED,
        limit=sweep_limit,
        what="the attempt whose VM vanished to fail",
        portal=portal,
    )
    # Expiry is the sync's (every SYNC_SECONDS): stopping, a final grading run, then the VM deleted.
    expired = seconds_until(
        lambda: expiring.vm_name not in vm_names(namespace),
        limit=2 * SYNC_SECONDS + 5,
        what="the expired attempt's VM to be deleted",
        portal=portal,
    )
    print(
        f"orphan sweep: unknown VM {orphan:.1f} s, lost teardown +{leftover:.1f} s, vanished VM +{gone:.1f} s, "
        f"expiry +{expired:.1f} s (sweep every {SWEEP_SECONDS} s, sync every {SYNC_SECONDS} s)"
    )
    # Each wait started after the previous one ended, so each figure is at most the time from the fault.
    assert orphan <= sweep_limit, orphan
    assert orphan + leftover <= sweep_limit, (orphan, leftover)
    assert orphan + leftover + gone <= sweep_limit, (orphan, leftover, gone)
    assert orphan + leftover + gone + expired <= 2 * SWEEP_SECONDS + 2 * SYNC_SECONDS + SLACK_SECONDS + 5

    vanished.refresh_from_db()
    assert vanished.failure_reason == "The VM was deleted outside the portal."
    wait_until(
        lambda: Attempt.objects.get(pk=expiring.pk).state == AttemptState.EXPIRED,
        timeout=60,
        what="the expired attempt to end",
        describe=portal.log_tail,
    )
    assert expiring.runs.get().trigger == "expiry"
    assert Attempt.objects.get(pk=kept.pk).state == AttemptState.RUNNING
    assert vm_names(namespace) == [kept.vm_name]
    assert operations.vm_get(namespace=namespace, name="teacher-demo") is not None  # not ours: untouched
    operations.vm_delete(namespace=namespace, name="teacher-demo")
    wait_until(
        lambda: not agreement([tenant]).problems,
        timeout=60,
        what="database and cluster to agree",
        describe=lambda: str(agreement([tenant]).problems),
    )
    # Nothing stayed behind the sweep's back for longer than it should: the record says when it last ran.
    swept_at = tenant.cluster_namespace.swept_at
    assert swept_at is not None and timezone.now() - swept_at < timedelta(seconds=2 * SWEEP_SECONDS + SLACK_SECONDS)


def test_the_sync_and_the_sweep_keep_their_pace_behind_a_backlog_of_work(portal, kubesim):
    # A class stops at once while the API server is slow: every worker process is busy with teardowns for a
    # while. The beat's periodic passes (expiry, crashes, vanished VMs) must still run as soon as a process is
    # free, not after the whole backlog (nor expire in the queue unrun, pass after pass).
    tenant = make_tenant("Backlog University", vms=16)
    lab = make_lab(make_course(tenant))
    attempts = [attempt_start(actor=s, lab=lab) for s in make_students(lab.course, 14)]
    wait_until(
        lambda: all(Attempt.objects.get(pk=a.pk).state == AttemptState.RUNNING for a in attempts),
        timeout=60,
        what="attempts to run",
        describe=portal.log_tail,
    )
    leaving, (expiring, vanished) = attempts[:12], attempts[12:]
    teardown_seconds = 2 * 2.0  # the VM and its Secret, each delete slowed by two seconds
    kubesim.admin.inject_fault(latency={"delete": 2.0})
    for attempt in leaving:
        attempt_stop(actor=attempt.student, attempt=attempt)
    time.sleep(1.0)  # the teardowns now occupy every worker process, with more queued behind them
    Attempt.objects.filter(pk=expiring.pk).update(expires_at=timezone.now())
    marked = time.monotonic()
    operations.vm_delete(namespace=tenant.namespace, name=vanished.vm_name)  # slow too, but done

    # Each waits for a free worker process: at most one teardown's time, then its own period.
    seen_expired = seconds_until(
        lambda: Attempt.objects.get(pk=expiring.pk).state != AttemptState.RUNNING,
        limit=teardown_seconds + 2 * SYNC_SECONDS + BACKLOG_SLACK_SECONDS,
        what="the expiry to be seen",
        portal=portal,
    )
    wait_until(
        lambda: Attempt.objects.get(pk=vanished.pk).state == AttemptState.FAILED,
        timeout=teardown_seconds + 2 * SWEEP_SECONDS + 60,
        interval=0.05,
        what="the vanished VM to be seen",
        describe=portal.log_tail,
    )
    seen_vanished = time.monotonic() - marked
    backlog_left = Attempt.objects.filter(pk__in=[a.pk for a in leaving], state=AttemptState.STOPPING).count()
    print(
        f"behind a backlog of {len(leaving)} teardowns of about {teardown_seconds:.0f} s on "
        f"{portal.concurrency} processes: expiry seen after {seen_expired:.1f} s, vanished VM after "
        f"{seen_vanished:.1f} s, {backlog_left} teardowns still queued or running then"
    )
    assert backlog_left > 0, "the backlog was gone before the periodic passes were measured"
    kubesim.admin.clear_faults()
    wait_until(
        lambda: not Attempt.objects.filter(tenant=tenant, state=AttemptState.STOPPING).exists(),
        timeout=120,
        what="the backlog to drain",
        describe=portal.log_tail,
    )
    # One teardown's time as this machine gave it (the first ones started at once): under load it outgrows the
    # slowed deletes, and a pass that waited for the whole backlog would still take several of them.
    ended = Attempt.objects.filter(pk__in=[a.pk for a in leaving])
    one_teardown = max(teardown_seconds, min((a.ended_at - a.stopping_at).total_seconds() for a in ended))
    assert seen_expired <= one_teardown + 2 * SYNC_SECONDS + BACKLOG_SLACK_SECONDS, (seen_expired, one_teardown)
    assert seen_vanished <= one_teardown + 2 * SWEEP_SECONDS + BACKLOG_SLACK_SECONDS, (seen_vanished, one_teardown)
