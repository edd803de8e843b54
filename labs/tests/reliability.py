"""Support for the reliability tests: a private kubesim, the portal's Celery worker and beat (and daphne) as real
processes on the test database and Redis, a clock the services read, and the cross-checks between the database
and the cluster that every fault test ends with.

Each reliability module starts its own kubesim, so the faults it injects never reach other tests: the fixture
factories ``kubesim_fixture``, ``cluster_fixture`` and ``clock_fixture`` give every module the same ``kubesim``,
``cluster`` and ``clock`` fixtures, set up as that module needs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from labs.kubevirt import client as kube_client
from labs.kubevirt import names, operations
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, Check, Lab, StdoutMatch
from portal.models import Course, Membership, Role, Tenant, User
from tests.run_isolation import delete_run_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct-horse-battery-staple"


# ---- waiting ----------------------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
    describe: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (which is returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"; {describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(interval)


def drive_to(attempt: Attempt, wanted: str, *, timeout: float = 30.0) -> Attempt:
    """Do in this process what the beat's sync and the agent checks do, until the attempt is ``wanted``."""
    from labs.services import agents, tracking

    def step() -> bool:
        tracking.namespace_sync(namespace=attempt.namespace)
        agents.agents_check(namespace=attempt.namespace)
        attempt.refresh_from_db()
        return attempt.state == wanted

    wait_until(
        step,
        timeout=timeout,
        what=f"attempt {attempt.id} to be {wanted}",
        describe=lambda: f"{attempt.state}: {attempt.failure_reason or attempt.status_message}",
    )
    return attempt


# ---- the cluster ------------------------------------------------------------------------------------------------


def start_kubesim(directory: Path, **options: Any):
    """A kubesim of its own for one module: real guests (an agent per VMI), room for a class of VMs."""
    from kubesim.testing import KubesimServer

    options.setdefault("nodes", 4)
    options.setdefault("node_cpu", "64")
    options.setdefault("node_memory", "2Ti")
    options.setdefault("node_pods", 500)
    return KubesimServer(directory, **options).start()


@contextlib.contextmanager
def portal_pointed_at(server, django_settings) -> Iterator[Any]:
    """The portal's cluster client (and its readiness probe) talk to ``server`` for the duration."""
    from labs import health

    django_settings.KUBECONFIG = str(server.kubeconfig)
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    kube_client.reset()
    health.reset_cluster_probe()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.admin.clear_faults()
        kube_client.reset()
        health.reset_cluster_probe()


def kubesim_fixture(name: str, **options: Any):
    """A module-scoped ``kubesim`` fixture: the module's own kubesim (``start_kubesim(**options)``), stopped after
    its last test. Use as ``kubesim = kubesim_fixture("timers")``."""

    @pytest.fixture(scope="module", name="kubesim")
    def kubesim(tmp_path_factory):
        server = start_kubesim(tmp_path_factory.mktemp(f"kubesim-{name}"), **options)
        yield server
        server.stop()

    return kubesim


def cluster_fixture(*, database: bool = True, **setting_overrides: Any):
    """A ``cluster`` fixture: the portal pointed at the module's ``kubesim`` for one test, with
    ``setting_overrides`` applied (a callable value is given the test's ``tmp_path``).

    With ``database`` (the default) the test gets a transactional database, and Redis is flushed and every
    attempt's VM deleted around it, so one test's work never reaches the next; without it the test (or its
    ``portal`` fixture) looks after those itself. Use as ``cluster = cluster_fixture(GRADING_MIN_INTERVAL_SECONDS=0)``.
    """

    @pytest.fixture(name="cluster")
    def cluster(request, kubesim, settings, tmp_path):
        for setting, value in setting_overrides.items():
            setattr(settings, setting, value(tmp_path) if callable(value) else value)
        if not database:
            with portal_pointed_at(kubesim, settings):
                yield kubesim
            return
        request.getfixturevalue("transactional_db")
        flush_redis()
        with portal_pointed_at(kubesim, settings):
            yield kubesim
        delete_every_vm(list(Attempt.objects.values_list("namespace", flat=True).distinct()))
        flush_redis()

    return cluster


def vm_names(namespace: str) -> list[str]:
    return sorted(vm["metadata"]["name"] for vm in operations.vms_list(namespace=namespace))


def vms_by_name(namespace: str) -> dict[str, dict[str, Any]]:
    return {vm["metadata"]["name"]: vm for vm in operations.vms_list(namespace=namespace)}


def vmis_by_name(namespace: str) -> dict[str, dict[str, Any]]:
    return {vmi["metadata"]["name"]: vmi for vmi in operations.vmis_list(namespace=namespace)}


def delete_every_vm(namespaces: list[str]) -> None:
    for namespace in namespaces:
        with contextlib.suppress(operations.ClusterError):
            for name in vm_names(namespace):
                operations.vm_delete(namespace=namespace, name=name)


def quota_used(namespace: str) -> dict[str, str]:
    """What the namespace's ResourceQuota says is in use (kubesim reconciles it from the virt-launcher pods)."""
    quota = kube_client.core_v1().read_namespaced_resource_quota(names.RESOURCE_QUOTA, namespace)
    return dict((quota.status.used if quota.status else None) or {})


def launcher_pods(namespace: str) -> int:
    """virt-launcher pods holding resources in the namespace (what the ResourceQuota counts)."""
    pods = kube_client.core_v1().list_namespaced_pod(namespace).items
    return sum(1 for pod in pods if (pod.status.phase if pod.status else "") not in ("Succeeded", "Failed"))


def mebibytes(quantity: str) -> Decimal:
    from kubernetes.utils import parse_quantity

    return parse_quantity(quantity) / (1024 * 1024)


def millicores(quantity: str) -> Decimal:
    from kubernetes.utils import parse_quantity

    return parse_quantity(quantity) * 1000


# ---- people and labs --------------------------------------------------------------------------------------------


def make_tenant(name: str, *, vms: int = 50) -> Tenant:
    return Tenant.objects.create(name=name, max_concurrent_vms=vms, max_vcpus=vms * 4, max_memory_mib=vms * 8192)


def make_course(tenant: Tenant, code: str = "REL101") -> Course:
    return Course.objects.create(tenant=tenant, code=code, title="Reliability", term="2026 fall")


def make_lab(course: Course, *, title: str = "Linux basics", check_timeout_s: int = 30, **fields: Any) -> Lab:
    """A lab with two checks, as the personas' lab has: a file exists, and it says hello world."""
    lab = Lab.objects.create(course=course, title=title, image="quay.io/containerdisks/fedora:41", **fields)
    Check.objects.create(
        lab=lab, order=1, title="hello.txt exists", command="test -f ~/hello.txt", points=1, timeout_s=check_timeout_s
    )
    Check.objects.create(
        lab=lab,
        order=2,
        title="hello.txt says hello world",
        command="cat ~/hello.txt",
        stdout_match=StdoutMatch.CONTAINS,
        stdout_pattern="hello world",
        points=2,
        timeout_s=check_timeout_s,
    )
    return lab


def make_students(course: Course, count: int, *, prefix: str = "student") -> list[User]:
    """``count`` students of the course (one bulk insert: a soak's 200 students cost milliseconds)."""
    from django.contrib.auth.hashers import make_password

    password = make_password(PASSWORD)
    users = User.objects.bulk_create(
        [
            User(
                username=f"{prefix}{course.pk}_{i}",
                password=password,
                email=f"{prefix}{course.pk}_{i}@example.test",
                tenant=course.tenant,
                full_name=f"Student {i}",
            )
            for i in range(count)
        ]
    )
    Membership.objects.bulk_create([Membership(user=user, course=course, role=Role.STUDENT) for user in users])
    return users


# ---- a clock the services read ----------------------------------------------------------------------------------


class Clock:
    """``django.utils.timezone.now`` shifted by an offset the test moves forward (time keeps flowing, so
    timeouts on real sockets still behave). Every service reads the time through ``timezone.now()``."""

    def __init__(self, real_now: Callable[[], datetime]) -> None:
        self._real_now = real_now
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return self._real_now() + self.offset

    def advance(self, **delta: float) -> datetime:
        self.offset += timedelta(**delta)
        return self.now()


def clock_fixture():
    """A ``clock`` fixture: ``timezone.now`` shifted by a ``Clock`` the test moves forward, for one test."""

    @pytest.fixture(name="clock")
    def clock(monkeypatch) -> Clock:
        from django.utils import timezone

        shifted = Clock(timezone.now)
        monkeypatch.setattr(timezone, "now", shifted.now)
        return shifted

    return clock


# ---- the portal's processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_database_url() -> str:
    """The database the test runs against (pytest-django's ``test_...`` one), as a URL for child processes."""
    db = connection.settings_dict
    auth = db["USER"] or "postgres"
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def flush_redis() -> None:
    """Delete this test process's Redis keys: no task message, lease or heartbeat left by an earlier test."""
    delete_run_keys()


def queued_messages(queue: str = "celery") -> int:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(client.llen(settings.REDIS_KEY_PREFIX + queue))
    finally:
        client.close()


@dataclass
class PortalProcesses:
    """Celery worker, Celery beat and (optionally) daphne, started as an operator would start them, on the test
    database, this run's Redis and the module's kubesim. ``kill()`` is SIGKILL to each whole process group."""

    directory: Path
    kubeconfig: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    concurrency: int = 2
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    daphne_port: int | None = None
    starts: int = 0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "PORTAL_ENV": "test",
                "DATABASE_URL": test_database_url(),
                "REDIS_URL": settings.REDIS_URL,
                "KUBECONFIG": str(self.kubeconfig),
                "PYTHONPATH": str(REPO_ROOT),
                "LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.update(self.env_overrides)
        return env

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it open
        try:
            process = subprocess.Popen(
                command,
                cwd=str(REPO_ROOT),
                env=self.env(),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.processes[name] = process
        return process

    def start(self, *, daphne: bool = False) -> PortalProcesses:
        self.starts += 1
        celery = [sys.executable, "-m", "celery", "-A", "portal"]
        self._spawn(
            "worker",
            [
                *celery,
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                str(self.concurrency),
                "--prefetch-multiplier",
                "1",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"reliability{self.starts}@%h",
            ],
        )
        self._spawn(
            "beat",
            [
                *celery,
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.directory / f"beat-schedule-{self.starts}"),
                "--pidfile",
                "",
            ],
        )
        if daphne:
            self.daphne_port = free_port()
            self._spawn(
                "daphne",
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.daphne_port),
                    "ops.asgi:application",
                ],
            )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """The worker is consuming (its log says ready); daphne answers /healthz."""
        log = self.directory / "worker.log"

        def worker_ready() -> bool:
            self.check_alive()
            text = log.read_text(errors="replace") if log.exists() else ""
            return text.count(" ready.") >= self.starts

        wait_until(worker_ready, timeout=timeout, what="the Celery worker to be ready", describe=self.log_tail)
        if "daphne" in self.processes:
            wait_until(
                lambda: self.http_get("/healthz")[0] == 200, timeout=timeout, what="daphne", describe=self.log_tail
            )

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}; {self.log_tail()}")

    def http_get(self, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.daphne_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own loopback server
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def kill(self) -> None:
        """SIGKILL every process group (worker with its pool children, beat, daphne): nothing is shut down."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self.processes.clear()

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL for whatever is still there."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        self.kill()

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for name in ("worker", "beat", "daphne"):
            path = self.directory / f"{name}.log"
            if path.exists():
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                parts.append(f"--- {name} ---\n{tail}")
        return "\n".join(parts)

    def log_text(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


# ---- what the database and the cluster must agree on ------------------------------------------------------------


@dataclass
class Agreement:
    """One look at the database and the cluster side by side, with what disagrees."""

    attempts_by_state: dict[str, int]
    vms: int
    vmis: int
    orphan_vms: list[str]
    active_without_vm: list[int]
    runs_by_state: dict[str, int]
    unfinished_runs: list[int]
    quota_mismatches: list[str]

    @property
    def problems(self) -> list[str]:
        problems = []
        if self.orphan_vms:
            problems.append(f"VMs no active attempt owns: {self.orphan_vms}")
        if self.active_without_vm:
            problems.append(f"active attempts without a VM: {self.active_without_vm}")
        if self.unfinished_runs:
            problems.append(f"grading runs not final: {self.unfinished_runs}")
        problems += self.quota_mismatches
        return problems


def agreement(tenants: list[Tenant]) -> Agreement:
    """Compare, per tenant namespace: VMs against active attempts (both ways), and the tenant's quota counters (the
    portal's sums over active attempts) against the cluster's ResourceQuota usage and VM count."""
    from django.db.models import Count, Sum

    from grading.models import GradingRun, RunState

    orphan_vms: list[str] = []
    active_without_vm: list[int] = []
    quota_mismatches: list[str] = []
    total_vms = total_vmis = 0
    for tenant in tenants:
        namespace = tenant.namespace
        vms = vms_by_name(namespace)
        vmis = vmis_by_name(namespace)
        total_vms += len(vms)
        total_vmis += len(vmis)
        active = {a.vm_name: a for a in Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES)}
        orphan_vms += [f"{namespace}/{name}" for name in vms if name not in active]
        active_without_vm += [
            a.id for name, a in active.items() if name not in vms and a.state != AttemptState.REQUESTED
        ]
        totals = Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).aggregate(
            vms=Count("id"), memory=Sum("launcher_memory_mib"), cpu=Sum("launcher_cpu_millicores")
        )
        used = quota_used(namespace)
        cluster_pods = launcher_pods(namespace)
        cluster_memory = mebibytes(used.get("requests.memory", "0"))
        cluster_cpu = millicores(used.get("requests.cpu", "0"))
        portal = (totals["vms"] or 0, Decimal(totals["memory"] or 0), Decimal(totals["cpu"] or 0))
        # The portal's memory arithmetic errs high by design (labs.sizes: within 2 % of what KubeVirt requests),
        # so that it never admits a VM the namespace quota would refuse; VM count and CPU must match exactly.
        memory_agrees = cluster_memory <= portal[1] <= cluster_memory * Decimal("1.02")
        if (portal[0], portal[0]) != (len(vms), cluster_pods) or not memory_agrees or portal[2] != cluster_cpu:
            quota_mismatches.append(
                f"{namespace}: portal counts {portal[0]} VMs, {portal[1]} MiB, {portal[2]}m CPU; the cluster has "
                f"{len(vms)} VMs, {cluster_pods} launcher pods, {cluster_memory} MiB, {cluster_cpu}m CPU"
            )
    attempts = Attempt.objects.filter(tenant__in=tenants)
    runs = GradingRun.objects.filter(attempt__tenant__in=tenants)
    return Agreement(
        attempts_by_state=dict(attempts.values_list("state").annotate(n=Count("id")).order_by()),
        vms=total_vms,
        vmis=total_vmis,
        orphan_vms=orphan_vms,
        active_without_vm=active_without_vm,
        runs_by_state=dict(runs.values_list("state").annotate(n=Count("id")).order_by()),
        unfinished_runs=list(runs.exclude(state__in=(RunState.DONE, RunState.ERROR)).values_list("id", flat=True)),
        quota_mismatches=quota_mismatches,
    )


def all_final(tenants: list[Tenant]) -> bool:
    return not Attempt.objects.filter(tenant__in=tenants).exclude(state__in=FINAL_STATES).exists()
