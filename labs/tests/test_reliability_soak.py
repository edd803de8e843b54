"""A soak: 200 attempts started, checked and stopped at random by 200 students while faults are injected at random
(API errors and latency, dropped agent connections, crashed VMIs, VMs deleted behind the portal's back, time
limits running out), against the real Celery worker and beat, PostgreSQL, Redis and kubesim with a real agent in
every guest. Afterwards: no orphan VM, no active attempt without a VM, every grading run final, and the tenants'
quota counters equal to what the cluster runs; then everything is stopped and nothing is left.

``SOAK_SECONDS`` sets how long students keep acting (default 30; a few minutes for a long run), ``SOAK_SEED``
the random seed. The counts are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from grading.models import GradingRun
from grading.services import grading_run_request
from labs.kubevirt import operations
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, Lab
from labs.services import attempt_start, attempt_stop
from labs.tests.reliability import (
    PortalProcesses,
    agreement,
    all_final,
    flush_redis,
    kubesim_fixture,
    launcher_pods,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    portal_pointed_at,
    wait_until,
)
from portal.errors import ApplicationError
from portal.models import Tenant, User

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "30"))
SOAK_SEED = int(os.environ.get("SOAK_SEED", str(int(time.time()))))
ATTEMPTS = 200
# Students acting at the same moment (the web process's request threads).
DRIVER_THREADS = 6
TENANTS = 2
SETTLE_SECONDS = 240

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(int(SOAK_SECONDS) + 2 * SETTLE_SECONDS + 120),
]


kubesim = kubesim_fixture("soak", seed=SOAK_SEED)


@pytest.fixture
def portal(kubesim, settings, tmp_path, transactional_db):
    settings.GRADING_MIN_INTERVAL_SECONDS = 2
    flush_redis()
    with portal_pointed_at(kubesim, settings):
        processes = PortalProcesses(
            directory=tmp_path / "processes",
            kubeconfig=kubesim.kubeconfig,
            concurrency=4,
            env_overrides={
                "ATTEMPT_SYNC_INTERVAL_SECONDS": "1",
                "ATTEMPT_SWEEP_INTERVAL_SECONDS": "5",
                "ATTEMPT_RESYNC_SECONDS": "5",
                "GRADING_MIN_INTERVAL_SECONDS": "2",
            },
        )
        processes.start()
        yield processes
        processes.stop()
    flush_redis()


@dataclass
class Student:
    user: User
    lab: Lab
    start_at: float
    attempt_id: int | None = None
    next_action_at: float = 0.0
    stop_at: float | None = None
    checks_left: int = 0
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class Tally:
    """What the students and the fault injector did."""

    actions: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    most_running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, counter: str, key: str, amount: float = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += amount


FAULTS = (
    "list_500",
    "create_503",
    "list_429",
    "latency",
    "delete_500",
    "agent_streams_cut",
    "vmi_crash",
    "vm_deleted",
    "time_up",
)


def fault_order(rng: random.Random):
    """Every kind of fault in turn, in a fresh random order each round, so that even a short soak sees them all."""
    while True:
        kinds = list(FAULTS)
        rng.shuffle(kinds)
        yield from kinds


def inject_fault(kind: str, rng: random.Random, cluster, tally: Tally) -> float:
    """One fault; returns for how many seconds it lasts (the injected API faults are cleared after)."""
    tally.add("faults", kind, 1)
    admin = cluster.admin
    if kind == "list_500":
        admin.inject_fault(code=500, verbs=["list"], rate=0.5)
    elif kind == "create_503":
        admin.inject_fault(code=503, verbs=["create"], rate=0.4)
    elif kind == "list_429":
        admin.inject_fault(code=429, verbs=["list"], rate=0.5, retry_after=1)
    elif kind == "latency":
        admin.inject_fault(latency={"*": rng.uniform(0.1, 0.4)})
    elif kind == "delete_500":
        admin.inject_fault(code=500, verbs=["delete"], rate=0.5)
    elif kind == "agent_streams_cut":
        admin.disconnect_consoles(portforwards=True)
        return 0.0
    else:
        running = list(Attempt.objects.filter(state=AttemptState.RUNNING).values_list("id", "namespace", "vm_name"))
        if not running:
            return 0.0
        attempt_id, namespace, vm_name = rng.choice(running)
        if kind == "vmi_crash":
            admin.fail_vmi(namespace, vm_name, reason="Crashed", message="injected by the soak")
        elif kind == "vm_deleted":
            operations.vm_delete(namespace=namespace, name=vm_name)
        else:  # the time limit runs out
            Attempt.objects.filter(id=attempt_id, state=AttemptState.RUNNING).update(expires_at=timezone.now())
        return 0.0
    return rng.uniform(1.0, 3.0)


def inject_faults(rng: random.Random, cluster, tally: Tally, stop: threading.Event) -> None:
    """Faults one after another (each kind in turn, in random order) until ``stop`` is set; then none is left."""
    try:
        for kind in fault_order(rng):
            if stop.is_set():
                break
            lasts = inject_fault(kind, rng, cluster, tally)
            if stop.wait(lasts):
                break
            cluster.admin.clear_faults()
            if stop.wait(rng.uniform(0.5, 2.0)):
                break
    finally:
        cluster.admin.clear_faults()
        connection.close()


def act(student: Student, now: float, tally: Tally) -> None:
    """One step of a student: start, check now and then, stop (or leave it running). Runs in a thread of its own
    (students act at the same time, as requests do), so it closes its database connection when done."""
    try:
        _act(student, now, tally)
    finally:
        connection.close()


def _act(student: Student, now: float, tally: Tally) -> None:
    rng = student.rng
    if student.attempt_id is None:
        try:
            began = time.monotonic()
            attempt = attempt_start(actor=student.user, lab=student.lab)
            tally.add("seconds", "start", time.monotonic() - began)
        except ApplicationError as refusal:  # throttled or capacity full: come back later, as the page says
            tally.add("refusals", refusal.code, 1)
            student.next_action_at = now + rng.uniform(1.0, 3.0)
            return
        tally.add("actions", "start", 1)
        student.attempt_id = attempt.id
        student.checks_left = rng.choice((0, 1, 1, 2, 3))
        # About a quarter are left running until the end; the others stop after a while.
        student.stop_at = None if rng.random() < 0.25 else now + rng.uniform(5.0, SOAK_SECONDS * 0.6)
        student.next_action_at = now + rng.uniform(2.0, 6.0)
        return
    attempt = Attempt.objects.select_related("lab").get(pk=student.attempt_id)
    if attempt.state in FINAL_STATES or attempt.state == AttemptState.STOPPING:
        student.next_action_at = float("inf")
        return
    if student.stop_at is not None and now >= student.stop_at:
        try:
            began = time.monotonic()
            attempt_stop(actor=student.user, attempt=attempt)
            tally.add("seconds", "stop", time.monotonic() - began)
            tally.add("actions", "stop", 1)
        except ApplicationError as refusal:
            tally.add("refusals", refusal.code, 1)
        student.next_action_at = float("inf")
        return
    if attempt.state == AttemptState.RUNNING and student.checks_left:
        try:
            began = time.monotonic()
            grading_run_request(actor=student.user, attempt=attempt)
            tally.add("seconds", "check", time.monotonic() - began)
            tally.add("actions", "check", 1)
            student.checks_left -= 1
        except ApplicationError as refusal:
            tally.add("refusals", refusal.code, 1)
    student.next_action_at = now + rng.uniform(1.0, 4.0)
    if student.stop_at is not None:
        student.next_action_at = min(student.next_action_at, student.stop_at)


def by_state(tenants: list[Tenant]) -> dict[str, int]:
    rows = Attempt.objects.filter(tenant__in=tenants).values_list("state").annotate(n=Count("id")).order_by()
    return dict(rows)


def settled(tenants: list[Tenant]) -> bool:
    """Nothing in flight: every attempt runs or has ended, and no grading run is unfinished."""
    moving = Attempt.objects.filter(tenant__in=tenants, state__in=ACTIVE_STATES).exclude(state=AttemptState.RUNNING)
    return not moving.exists() and not agreement(tenants).problems


def test_soak_200_attempts_with_random_faults_leaves_nothing_behind(portal, kubesim):
    rng = random.Random(SOAK_SEED)
    tenants = [make_tenant(f"Soak Tenant {i}", vms=ATTEMPTS) for i in range(TENANTS)]
    students: list[Student] = []
    for tenant in tenants:
        lab = make_lab(make_course(tenant), check_timeout_s=5)
        for user in make_students(lab.course, ATTEMPTS // TENANTS):
            start_at = rng.uniform(0.0, SOAK_SECONDS * 0.6)
            students.append(
                Student(user=user, lab=lab, start_at=start_at, next_action_at=start_at, rng=random.Random(rng.random()))
            )
    tally = Tally()
    began = time.monotonic()
    kubesim.admin.reset_counters()
    stop_faults = threading.Event()
    injector = threading.Thread(
        target=inject_faults, args=(random.Random(rng.random()), kubesim, tally, stop_faults), name="soak-faults"
    )
    injector.start()

    # The soak: students act when due while the faults come and go.
    loops = 0
    pool = ThreadPoolExecutor(max_workers=DRIVER_THREADS, thread_name_prefix="soak-student")
    try:
        while True:
            now = time.monotonic() - began
            if now >= SOAK_SECONDS and all(s.attempt_id is not None for s in students):
                break
            assert now < SOAK_SECONDS + SETTLE_SECONDS, "not every student could start within the settle time"
            if now >= SOAK_SECONDS:
                stop_faults.set()
            due = [student for student in students if student.next_action_at <= now]
            acting = time.monotonic()
            list(pool.map(act, due, [now] * len(due), [tally] * len(due)))
            tally.add("seconds", "acting", time.monotonic() - acting)
            counting = time.monotonic()
            tally.most_running = max(
                tally.most_running, Attempt.objects.filter(tenant__in=tenants, state=AttemptState.RUNNING).count()
            )
            tally.add("seconds", "counting", time.monotonic() - counting)
            loops += 1
            time.sleep(0.05)
    finally:
        pool.shutdown(wait=True)
        stop_faults.set()
        injector.join(timeout=30)
    kubesim.admin.clear_faults()
    acted_for = time.monotonic() - began
    api_requests = kubesim.admin.counters()["total"]

    # Settled: faults gone, every attempt running or ended; then the database and the cluster must agree.
    wait_until(
        lambda: settled(tenants),
        timeout=SETTLE_SECONDS,
        interval=1.0,
        what="the soak to settle",
        describe=lambda: f"{by_state(tenants)} {agreement(tenants).problems[:5]}\n{portal.log_tail(10)}",
    )
    checkpoint = agreement(tenants)
    running_after_soak = checkpoint.attempts_by_state.get(AttemptState.RUNNING, 0)
    assert checkpoint.problems == []
    assert checkpoint.vms == running_after_soak == sum(launcher_pods(t.namespace) for t in tenants)

    # Everyone leaves: all stopped, nothing left on the cluster, every quota counter back to zero.
    for attempt in Attempt.objects.filter(tenant__in=tenants, state=AttemptState.RUNNING).select_related("student"):
        try:
            attempt_stop(actor=attempt.student, attempt=attempt)
        except ApplicationError as refusal:
            tally.add("refusals", refusal.code, 1)

    def nothing_left() -> bool:
        if not all_final(tenants):
            return False
        seen = agreement(tenants)
        return not seen.problems and seen.vms == 0

    wait_until(
        nothing_left,
        timeout=SETTLE_SECONDS,
        interval=1.0,
        what="every attempt to end and every VM to go",
        describe=lambda: f"{by_state(tenants)} {agreement(tenants).problems[:5]}\n{portal.log_tail(10)}",
    )
    final = agreement(tenants)
    started = Attempt.objects.filter(tenant__in=tenants).count()
    assert started == ATTEMPTS
    assert final.problems == [] and final.vms == 0 and final.vmis == 0
    assert sum(launcher_pods(t.namespace) for t in tenants) == 0
    assert not Attempt.objects.filter(tenant__in=tenants, state__in=ACTIVE_STATES).exists()
    assert final.unfinished_runs == []
    runs = GradingRun.objects.filter(attempt__tenant__in=tenants)
    assert runs.exclude(state__in=("done", "error")).count() == 0
    # A run that failed carries its reason: no silent error.
    assert not runs.filter(state="error", error_code="").exists()
    failed = Attempt.objects.filter(tenant__in=tenants, state=AttemptState.FAILED)
    assert not failed.filter(failure_reason="").exists()

    print(
        f"\nSOAK seed={SOAK_SEED} students acted for {acted_for:.0f} s (SOAK_SECONDS={SOAK_SECONDS:g}, "
        f"{loops} rounds of the students' loop, {dict(tally.seconds)} s)"
        f"\n  attempts started: {started}; at most {tally.most_running} running at once"
        f"\n  student actions: {dict(tally.actions)}; refusals: {dict(tally.refusals)}"
        f"\n  faults injected: {sum(tally.faults.values())} {dict(sorted(tally.faults.items()))}"
        f"\n  API requests during the soak: {api_requests}"
        f"\n  after the soak (faults cleared, settled): attempts {checkpoint.attempts_by_state}, "
        f"VMs {checkpoint.vms}, launcher pods {running_after_soak}, orphan VMs {len(checkpoint.orphan_vms)}, "
        f"active without VM {len(checkpoint.active_without_vm)}, quota mismatches {len(checkpoint.quota_mismatches)}"
        f"\n  after everyone stopped: attempts {final.attempts_by_state}, VMs {final.vms}, VMIs {final.vmis}, "
        f"grading runs {final.runs_by_state}, unfinished runs {len(final.unfinished_runs)}"
        f"\n  failure reasons: {dict(Counter(r[:60] for r in failed.values_list('failure_reason', flat=True)))}"
        f"\n  grading errors: {dict(Counter(runs.filter(state='error').values_list('error_code', flat=True)))}"
    )
