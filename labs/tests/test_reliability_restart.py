"""Restart with labs running: the worker, beat and web processes are SIGKILLed while attempts run, one VM is
deleted while they are down, a student presses Start meanwhile; after the restart the live attempts are still
running on the same VMs, the dead one has failed with its quota freed, the waiting start is served, and no VM
was made twice."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache

from labs import tasks
from labs.kubevirt import operations
from labs.models import ACTIVE_STATES, Attempt, AttemptState
from labs.services import attempt_start, tracking
from labs.tests.reliability import (
    PortalProcesses,
    agreement,
    cluster_fixture,
    flush_redis,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    vm_names,
    vmis_by_name,
    vms_by_name,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

SYNC_SECONDS = 1
SWEEP_SECONDS = 2


kubesim = kubesim_fixture("restart")
cluster = cluster_fixture(database=False)  # the portal fixture sets up the database and Redis


@pytest.fixture
def portal(cluster, tmp_path, transactional_db):
    flush_redis()
    processes = PortalProcesses(
        directory=tmp_path / "processes",
        kubeconfig=cluster.kubeconfig,
        env_overrides={
            "ATTEMPT_SYNC_INTERVAL_SECONDS": str(SYNC_SECONDS),
            "ATTEMPT_SWEEP_INTERVAL_SECONDS": str(SWEEP_SECONDS),
            "HEALTH_SYNC_MAX_AGE_SECONDS": "10",
        },
    )
    yield processes
    processes.stop()
    flush_redis()


def states(attempts: list[Attempt]) -> list[str]:
    return [Attempt.objects.get(pk=a.pk).state for a in attempts]


def test_restart_with_labs_running_keeps_live_ones_and_frees_the_dead_one(portal, cluster):
    tenant = make_tenant("Restart University", vms=4)
    lab = make_lab(make_course(tenant))
    students = make_students(lab.course, 4)
    portal.start(daphne=True)

    attempts = [attempt_start(actor=student, lab=lab) for student in students[:3]]
    wait_until(
        lambda: states(attempts) == [AttemptState.RUNNING] * 3,
        timeout=60,
        what="three attempts running",
        describe=lambda: f"{states(attempts)}\n{portal.log_tail()}",
    )
    namespace = tenant.namespace
    vm_uids = {name: vm["metadata"]["uid"] for name, vm in vms_by_name(namespace).items()}
    vmi_uids = {name: vmi["metadata"]["uid"] for name, vmi in vmis_by_name(namespace).items()}
    assert sorted(vm_uids) == sorted(a.vm_name for a in attempts)
    wait_until(
        lambda: portal.http_get("/readyz")[0] == 200,
        timeout=20,
        what="/readyz to be ready",
        describe=lambda: portal.http_get("/readyz")[1].decode(),
    )

    portal.kill()  # worker (and its pool), beat and daphne: SIGKILL, no shutdown of any kind
    # Killed in the middle of a sync and a sweep (a second earlier or later, and it would have been): their locks
    # stay behind until they expire, as they would after any such kill.
    namespace = tenant.namespace
    cache.set(tasks.SYNC_LOCK_KEY, "1", timeout=tasks.HARD_LIMIT)
    cache.set(tasks.SWEEP_LOCK_KEY, "1", timeout=tasks.HARD_LIMIT)
    cache.set(tracking.NAMESPACE_LOCK_KEY.format(namespace=namespace), "1", timeout=tracking.NAMESPACE_LOCK_SECONDS)
    survivor_a, survivor_b, dead = attempts
    assert operations.vm_delete(namespace=namespace, name=dead.vm_name)
    wait_until(lambda: dead.vm_name not in vm_names(namespace), timeout=20, what="the VM to be deleted")
    # A student presses Start while no worker runs: the request is accepted, its task waits in the broker.
    waiting = attempt_start(actor=students[3], lab=lab)
    assert Attempt.objects.get(pk=waiting.pk).state == AttemptState.REQUESTED

    portal.start(daphne=True)

    wait_until(
        lambda: Attempt.objects.get(pk=dead.pk).state == AttemptState.FAILED,
        timeout=30,
        what="the attempt whose VM vanished to fail",
        describe=portal.log_tail,
    )
    dead.refresh_from_db()
    assert dead.failure_reason == "The VM was deleted outside the portal."
    assert dead.ended_at is not None
    wait_until(
        lambda: Attempt.objects.get(pk=waiting.pk).state == AttemptState.RUNNING,
        timeout=60,
        what="the start pressed during the outage to be served",
        describe=portal.log_tail,
    )

    # The live attempts never noticed: still running, on the very VMs and VMIs they had (no re-creation).
    assert states([survivor_a, survivor_b]) == [AttemptState.RUNNING] * 2
    vms = vms_by_name(namespace)
    vmis = vmis_by_name(namespace)
    assert sorted(vms) == sorted([survivor_a.vm_name, survivor_b.vm_name, waiting.vm_name])
    for attempt in (survivor_a, survivor_b):
        assert vms[attempt.vm_name]["metadata"]["uid"] == vm_uids[attempt.vm_name]
        assert vmis[attempt.vm_name]["metadata"]["uid"] == vmi_uids[attempt.vm_name]
    # Quota freed: the portal counts three active attempts, and the cluster runs exactly three launcher pods.
    assert Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).count() == 3
    seen = agreement([tenant])
    assert seen.problems == [], seen.problems
    # The restarted web process reports ready once the restarted beat and worker have synced again.
    wait_until(
        lambda: portal.http_get("/readyz")[0] == 200,
        timeout=20,
        what="/readyz after the restart",
        describe=lambda: portal.http_get("/readyz")[1].decode(),
    )
    body = json.loads(portal.http_get("/readyz")[1])
    assert body["status"] == "ready" and body["failing"] == []
    # One VM per attempt across the whole test: the kubesim counters saw no second create succeed.
    creates = cluster.admin.counters()["by_verb_resource"].get("create virtualmachines", 0)
    assert creates == 4, creates
