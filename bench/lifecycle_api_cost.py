"""Lifecycle engine: Start → attempt ``running`` latency, and cluster API cost per running attempt in steady state.

The portal runs as in production (Celery worker and beat as their own processes, PostgreSQL, Redis) against
kubesim with zero phase delays and real guests (a shell and the grading agent per VM). This process plays the
students: it calls ``labs.services.attempt_start`` (what the Start button's view calls) and watches the database
until the attempt is ``running``, which the lifecycle sets only once the guest agent answered ``/healthz``
through portforward.

1. ``single``: starts one after another, each timed from the call to ``running``.
2. ``burst``: the remaining students press Start at the same moment.
3. ``steady``: with every attempt running, kubesim's request counters are reset and read again after a window
   of beat-driven syncs and sweeps: requests per running attempt per minute (target ≤ 0.5).

    python -m bench.lifecycle_api_cost   # BENCH_ATTEMPTS=50 BENCH_TENANTS=1 BENCH_SINGLE=10 BENCH_STEADY_SECONDS=90

Baseline, on the same kubesim: the same Secret and VM (the portal's own builders) created directly, then the
agent's ``/healthz`` asked through portforward every 20 ms until it answers. What the portal adds to a start is the
difference between the two.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    BASE_DIR,
    BENCH_VAR,
    emit,
    kubesim,
    log,
    machine,
    portal_environment,
    seed_course,
    setup_django,
    stop_process,
    summary_ms,
)

ATTEMPTS = int(os.environ.get("BENCH_ATTEMPTS", "50"))
TENANTS = int(os.environ.get("BENCH_TENANTS", "1"))
SINGLE = int(os.environ.get("BENCH_SINGLE", "10"))
STEADY_SECONDS = float(os.environ.get("BENCH_STEADY_SECONDS", "90"))
RUNNING_TIMEOUT = 120.0
BASELINE_NAMESPACE = "bench-lifecycle-direct"
TARGET_REQUESTS_PER_ATTEMPT_MINUTE = 0.5


@contextlib.contextmanager
def worker_and_beat(*, kubeconfig: Path, concurrency: int = 8) -> Iterator[None]:
    """A Celery worker and Celery beat, each its own process as in production; ready once a sync has run."""
    from django.core.cache import cache

    environment = portal_environment(KUBECONFIG=str(kubeconfig))
    logs = BENCH_VAR / "logs" / f"lifecycle-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "worker": [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ],
        "beat": [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "beat",
            "--schedule",
            str(logs / "celerybeat-schedule"),
            "--loglevel",
            "WARNING",
        ],
    }
    processes, handles = {}, []
    cache.delete("labs:sync:last_success")
    try:
        for name, command in commands.items():
            handle = (logs / f"{name}.log").open("ab")
            handles.append(handle)
            processes[name] = subprocess.Popen(
                command, cwd=BASE_DIR, env=environment, stdout=handle, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 90
        while cache.get("labs:sync:last_success") is None:
            for name, process in processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"the {name} exited with {process.returncode}; see {logs}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no sync ran within 90 s; see {logs}")
            time.sleep(0.2)
        yield
    finally:
        for process in processes.values():
            stop_process(process)
        for handle in handles:
            handle.close()


def wait_running(attempt_id: int, *, started: float) -> float:
    """Seconds from ``started`` until the attempt is running (polling the database every 5 ms)."""
    from labs.models import Attempt, AttemptState

    deadline = started + RUNNING_TIMEOUT
    while time.perf_counter() < deadline:
        state, reason = Attempt.objects.filter(id=attempt_id).values_list("state", "failure_reason").get()
        if state == AttemptState.RUNNING:
            return time.perf_counter() - started
        if state in (AttemptState.FAILED, AttemptState.STOPPED, AttemptState.EXPIRED):
            raise RuntimeError(f"attempt {attempt_id} ended {state}: {reason}")
        time.sleep(0.005)
    raise RuntimeError(f"attempt {attempt_id} not running after {RUNNING_TIMEOUT} s")


def start_and_wait(student: Any, lab: Any) -> float:
    from django.db import connection

    from labs.services import attempt_start

    try:
        started = time.perf_counter()
        attempt = attempt_start(actor=student, lab=lab)
        return wait_running(attempt.id, started=started)
    finally:
        connection.close()


def direct_start(index: int) -> float:
    """The baseline: Secret and VM created directly, then ``/healthz`` polled until the agent answers."""
    from types import SimpleNamespace

    from guest.cloud_init import render_user_data
    from labs.agent_client import AgentError, healthz
    from labs.kubevirt import manifests, names, operations

    namespace, name, token = BASELINE_NAMESPACE, names.vm_name(900_000 + index), f"baseline-token-{index:08d}"
    labels = {"app": "baseline"}
    started = time.perf_counter()
    operations.secret_create(
        manifests.cloud_init_secret(
            name=names.cloud_init_secret_name(name),
            namespace=namespace,
            labels=labels,
            user_data=render_user_data(token=token),
        )
    )
    operations.vm_create(
        manifests.virtual_machine(
            name=name,
            namespace=namespace,
            labels=labels,
            image="quay.io/containerdisks/fedora:41",
            vcpus=1,
            memory_mib=2048,
            host_passthrough=False,
            cloud_init_secret=names.cloud_init_secret_name(name),
        )
    )
    target = SimpleNamespace(namespace=namespace, vm_name=name, agent_token=token)
    deadline = started + RUNNING_TIMEOUT
    while time.perf_counter() < deadline:
        try:
            healthz(target, timeout_s=3)
            elapsed = time.perf_counter() - started
            operations.vm_delete(namespace=namespace, name=name)
            return elapsed
        except AgentError:
            time.sleep(0.02)
    raise RuntimeError(f"baseline VM {name} never answered")


def phase_breakdown(attempt_ids: list[int]) -> dict[str, Any]:
    """Where the time went, from the attempts' own timestamps (requested → VM created → VMI Running → agent)."""
    from labs.models import Attempt

    rows = Attempt.objects.filter(id__in=attempt_ids).values_list(
        "requested_at", "provisioned_at", "vmi_running_at", "agent_ready_at"
    )
    provision, to_vmi_running, to_agent = [], [], []
    for requested, provisioned, vmi_running, agent_ready in rows:
        provision.append((provisioned - requested).total_seconds())
        to_vmi_running.append(max(0.0, (vmi_running - provisioned).total_seconds()))
        to_agent.append(max(0.0, (agent_ready - vmi_running).total_seconds()))
    return {
        "requested_to_vm_created": summary_ms(provision),
        "vm_created_to_vmi_running": summary_ms(to_vmi_running),
        "vmi_running_to_agent_ready": summary_ms(to_agent),
    }


def main() -> None:
    setup_django()
    from django.conf import settings

    from labs.models import Attempt, AttemptState

    # Students spread over BENCH_TENANTS tenants (namespaces): the steady-state cost is per namespace.
    per_tenant = -(-ATTEMPTS // TENANTS)
    seeded = [
        seed_course(
            students=min(per_tenant, ATTEMPTS - index * per_tenant), labs=1, name=f"Lifecycle Bench {index + 1}"
        )
        for index in range(TENANTS)
    ]
    pairs = [(student, course.labs[0]) for course in seeded for student in course.students]
    result: dict[str, Any] = {
        "benchmark": "lifecycle_api_cost",
        "machine": machine(),
        "attempts": ATTEMPTS,
        "tenants": TENANTS,
        "sync_interval_s": settings.ATTEMPT_SYNC_INTERVAL_SECONDS,
        "resync_s": settings.ATTEMPT_RESYNC_SECONDS,
        "sweep_interval_s": settings.ATTEMPT_SWEEP_INTERVAL_SECONDS,
    }
    with kubesim(name="lifecycle", guest="shell") as cluster, worker_and_beat(kubeconfig=cluster.kubeconfig):
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        settings.KUBECONFIG = str(cluster.kubeconfig)

        from labs.kubevirt import client, manifests, operations

        client.reset()
        log(f"baseline: {SINGLE} direct VM starts")
        operations.namespace_bootstrap(
            namespace=manifests.namespace(name=BASELINE_NAMESPACE, tenant_id=0),
            policies=[],
            quota=manifests.resource_quota(
                namespace=BASELINE_NAMESPACE, tenant_id=0, max_vms=1000, max_vcpus=10_000, max_memory_mib=10**8
            ),
        )
        baseline = [direct_start(index) for index in range(SINGLE)]
        result["baseline_direct_start_to_agent"] = summary_ms(baseline)

        log(f"single starts: {SINGLE}")
        singles = [start_and_wait(student, lab) for student, lab in pairs[:SINGLE]]
        result["single_start_to_running"] = summary_ms(singles)
        result["single_start_portal_overhead_p50_ms"] = round(
            (result["single_start_to_running"]["p50_ms"] - result["baseline_direct_start_to_agent"]["p50_ms"]), 1
        )

        burst_students = pairs[SINGLE:]
        log(f"burst: {len(burst_students)} simultaneous starts")
        barrier = threading.Barrier(len(burst_students))
        burst: list[float] = []
        errors: list[str] = []

        def press(student: Any, lab: Any) -> None:
            try:
                barrier.wait(timeout=60)
                burst.append(start_and_wait(student, lab))
            except Exception as exc:
                errors.append(f"{exc.__class__.__name__}: {exc}")

        threads = [threading.Thread(target=press, args=pair) for pair in burst_students]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result["burst_start_to_running"] = summary_ms(burst)
        result["burst_errors"] = errors[:5]
        result["phase_breakdown_all"] = phase_breakdown(list(Attempt.objects.values_list("id", flat=True)))

        running = Attempt.objects.filter(state=AttemptState.RUNNING).count()
        log(f"steady state: {running} running attempts, {STEADY_SECONDS:.0f} s window")
        time.sleep(2 * settings.ATTEMPT_SYNC_INTERVAL_SECONDS)  # let the last follow-up syncs finish
        cluster.admin.reset_counters()
        window_started = time.monotonic()
        time.sleep(STEADY_SECONDS)
        counters = cluster.admin.counters()
        minutes = (time.monotonic() - window_started) / 60
        still_running = Attempt.objects.filter(state=AttemptState.RUNNING).count()
        per_attempt_minute = counters["total"] / still_running / minutes if still_running else None
        result["steady_state"] = {
            "running_attempts": still_running,
            "window_s": round(minutes * 60, 1),
            "requests": counters["total"],
            "requests_by_verb_resource": counters.get("by_verb_resource"),
            "requests_per_running_attempt_per_minute": round(per_attempt_minute, 4) if per_attempt_minute else None,
            "target": TARGET_REQUESTS_PER_ATTEMPT_MINUTE,
            "ok": per_attempt_minute is not None and per_attempt_minute <= TARGET_REQUESTS_PER_ATTEMPT_MINUTE,
        }
    emit(result)


if __name__ == "__main__":
    main()
