"""What the benchmarks share: their own database and Redis (``BENCH_DATABASE_URL``, ``BENCH_REDIS_URL``), kubesim,
a live portal run as in production, seeded courses, session cookies, percentiles and the JSON line each prints."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

BASE_DIR = Path(__file__).resolve().parent.parent
BENCH_VAR = BASE_DIR / "var" / "bench"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
PASSWORD = "bench-password-not-secret"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # ``python -m bench`` ends an overrunning benchmark with SIGTERM: unwinding runs the ``finally`` blocks that
    # stop its portal processes and kubesim (and kubesim its guests) instead of leaving them serving.
    raise SystemExit(128 + signum)


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


# --- environment -------------------------------------------------------------------------------------------


def bench_database_url() -> str:
    explicit = os.environ.get("BENCH_DATABASE_URL")
    if explicit:
        return explicit
    parsed = urllib.parse.urlsplit(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
    if not parsed.scheme.startswith("postgres"):
        raise SystemExit("The benchmarks need PostgreSQL: set BENCH_DATABASE_URL=postgres://...")
    name = parsed.path.lstrip("/") or "portal"
    return urllib.parse.urlunsplit(parsed._replace(path=f"/{name}_bench"))


def bench_redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or DEFAULT_REDIS_URL


def portal_environment(**overrides: str) -> dict[str, str]:
    """The environment of this process and of every portal process a benchmark starts."""
    env = {key: value for key, value in os.environ.items() if key not in ("KUBERNETES_SERVICE_HOST",)}
    database_url, redis_url = bench_database_url(), bench_redis_url()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PORTAL_ENV": "test",
            "DEBUG": "false",
            # Pinned, so that a process started with this environment derives the same names again.
            "BENCH_DATABASE_URL": database_url,
            "BENCH_REDIS_URL": redis_url,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "PORTAL_VAR_DIR": str(BENCH_VAR / "var"),
            "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            "PYTHONUNBUFFERED": "1",
            # One start per student per run; the per-user limit is not what is measured.
            "RATE_LIMIT_STARTS": "1000",
        }
    )
    env.update(overrides)
    return env


def _ensure_database(url: str) -> None:
    import psycopg

    parsed = urllib.parse.urlsplit(url)
    name = parsed.path.lstrip("/")
    admin_url = urllib.parse.urlunsplit(parsed._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            connection.execute(f'CREATE DATABASE "{name}"')  # the name comes from our own setting, not input


def setup_django(**overrides: str) -> None:
    """Point this process at the benchmark database and Redis, set Django up, migrate, and start empty."""
    os.environ.update(portal_environment(**overrides))
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    _ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    reset_state()


def reset_state() -> None:
    """Empty the benchmark database and Redis (never the portal's own: see the module docstring)."""
    import redis
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    redis.Redis.from_url(bench_redis_url()).flushdb()


# --- measuring and reporting ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100), interpolating linearly between ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, Any]:
    """n, p50, p95, p99, max and mean of durations given in seconds, reported in milliseconds."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    return {
        "n": len(seconds),
        "p50_ms": ms(percentile(seconds, 50)),
        "p95_ms": ms(percentile(seconds, 95)),
        "p99_ms": ms(percentile(seconds, 99)),
        "max_ms": ms(max(seconds) if seconds else None),
        "mean_ms": ms(sum(seconds) / len(seconds) if seconds else None),
    }


def reference_workload_ms() -> float:
    """How fast this machine runs Python right now: the best of five runs of one fixed pure-Python workload (a dict
    of 200,000 string keys, then its keys sorted by value), in milliseconds. The VMs these benchmarks run on change
    speed from one day to the next; this sets a run's figures beside another run's (lower is faster)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        table = {str(number): -number for number in range(200_000)}
        sorted(table, key=table.__getitem__)
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def machine() -> dict[str, Any]:
    return {
        "date": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "reference_workload_ms": reference_workload_ms(),
    }


def _process_times(pid: int | str) -> tuple[str, int, float, float] | None:
    """A process's name (``comm``), parent, own CPU seconds (user + system) and its reaped children's, from
    /proc (Linux); None where that cannot be read (the process is gone, or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
        fields = text.rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (
            text[text.find("(") + 1 : text.rfind(")")],
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / tick,
            (int(fields[13]) + int(fields[14])) / tick,
        )
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time a process has used so far, None where that cannot be read."""
    times = _process_times(pid)
    return None if times is None else times[2]


# Server processes counted by name (their ``comm``): the machine's PostgreSQL and Redis, whoever else they serve.
SERVERS = {"postgres": "postgres", "redis": "redis-server"}


def server_cpu_seconds() -> dict[str, float | None]:
    """CPU seconds each server in ``SERVERS`` has used so far, all its processes together (Linux; None without
    /proc): the live ones' own time, plus what the exited ones left in their parent's children's time (a
    PostgreSQL backend that ends mid-burst is still counted). Includes work for anybody else they serve."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return dict.fromkeys(SERVERS)
    processes = {
        int(entry): times for entry in entries if entry.isdigit() and (times := _process_times(entry)) is not None
    }
    totals: dict[str, float | None] = {}
    for name, comm in SERVERS.items():
        group = {pid for pid, process in processes.items() if process[0] == comm}
        totals[name] = (
            sum(processes[pid][2] + (processes[pid][3] if processes[pid][1] not in group else 0) for pid in group)
            if group
            else None
        )
    return totals


@contextlib.contextmanager
def cpu_used(pids: dict[str, int]) -> Iterator[dict[str, float | None]]:
    """CPU seconds each named process (and this one, as ``bench_clients``) used inside the block, filled in on
    exit: where a figure that is short of its target spent the machine. PostgreSQL and Redis are added as
    ``postgres`` and ``redis`` (every process of each on the machine: see ``server_cpu_seconds``)."""
    names = {**pids, "bench_clients": os.getpid()}
    before = {name: cpu_seconds(pid) for name, pid in names.items()}
    servers_before = server_cpu_seconds()
    started = time.perf_counter()
    used: dict[str, float | None] = {}
    yield used
    for name, pid in names.items():
        after = cpu_seconds(pid)
        used[name] = None if after is None or before[name] is None else round(after - before[name], 2)
    for name, after in server_cpu_seconds().items():
        used[name] = None if after is None or servers_before[name] is None else round(after - servers_before[name], 2)
    used["wall"] = round(time.perf_counter() - started, 2)
    used["cores"] = os.cpu_count()


@contextlib.contextmanager
def redis_commands_used() -> Iterator[dict[str, int]]:
    """Commands Redis served inside the block (server-wide, from ``INFO commandstats``; nothing else uses it during
    a run), filled in on exit: ``total`` and the busiest by name. A count, so unlike CPU it does not move with a
    noisy machine: the channel layer's, the broker's and the cache's round trips together."""
    import redis

    client = redis.Redis.from_url(bench_redis_url())

    def calls() -> dict[str, int]:
        return {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in client.info("commandstats").items()}

    try:
        before = calls()
        used: dict[str, int] = {}
        yield used
        after = calls()
        after["info"] = before.get("info", 0)  # our own two INFO calls are not the portal's
        spent = {name: count - before.get(name, 0) for name, count in after.items() if count > before.get(name, 0)}
        used["total"] = sum(spent.values())
        used.update(sorted(spent.items(), key=lambda item: -item[1])[:8])
    finally:
        client.close()


def emit(result: dict[str, Any]) -> None:
    """Print the benchmark's one JSON object (the last line of its output)."""
    sys.stdout.write(json.dumps(result, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log(message: str) -> None:
    """Progress on stderr, so stdout carries only the JSON."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# --- processes -----------------------------------------------------------------------------------------------


def stop_process(process: subprocess.Popen, *, timeout: float = 10) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextlib.contextmanager
def kubesim(
    *,
    name: str = "kubesim",
    nodes: int = 20,
    node_memory: str = "512Gi",
    node_cpu: str = "64",
    guest: str = "shell",
    **options: Any,
) -> Iterator[Any]:
    """kubesim (``kubesim.testing.KubesimServer``) with zero phase delays and room for a few hundred small VMs,
    its kubeconfig and log in a fresh directory under ``var/bench/``. Its admin API is ``server.admin``
    (``counters()``, ``reset_counters()``, ``inject_fault(...)``)."""
    from kubesim.testing import KubesimServer

    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=BENCH_VAR))  # several runs may share var/bench
    with KubesimServer(
        directory,
        nodes=nodes,
        node_memory=node_memory,
        node_cpu=node_cpu,
        node_pods=1000,
        guest=guest,
        log_level="WARNING",
        **options,
    ) as server:
        yield server


@dataclass
class LivePortal:
    """daphne, a Celery worker and Celery beat serving the benchmark database, each its own process."""

    base_url: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def ws_url(self) -> str:
        return "ws" + self.base_url[len("http") :]

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"The portal's {name} exited with {process.returncode}; see {BENCH_VAR}/logs")


@contextlib.contextmanager
def live_portal(
    *, kubeconfig: Path, worker_concurrency: int = 8, beat: bool = True, env: dict[str, str] | None = None
) -> Iterator[LivePortal]:
    """Start the portal as production runs it and wait until it serves ``/healthz``."""
    port = free_port()
    # A pool per process, as production should run (portal/settings.py, DB_POOL_MAX_SIZE): without it 100
    # simultaneous requests open 100 connections and PostgreSQL refuses the rest.
    environment = portal_environment(KUBECONFIG=str(kubeconfig), DB_POOL_MAX_SIZE="12", **(env or {}))
    logs = BENCH_VAR / "logs" / f"portal-{port}"
    logs.mkdir(parents=True, exist_ok=True)
    schedule = logs / "celerybeat-schedule"
    commands = {
        "web": [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "ops.asgi:application"],
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
            str(worker_concurrency),
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            environment["LOG_LEVEL"],
        ],
    }
    if beat:
        commands["beat"] = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "beat",
            "--schedule",
            str(schedule),
            "--loglevel",
            "WARNING",
        ]
    portal = LivePortal(base_url=f"http://127.0.0.1:{port}")
    handles = []
    try:
        for name, command in commands.items():
            handle = (logs / f"{name}.log").open("ab")
            handles.append(handle)
            portal.processes[name] = subprocess.Popen(
                command, cwd=BASE_DIR, env=environment, stdout=handle, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while True:
            portal.check_alive()
            try:
                if requests.get(f"{portal.base_url}/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or busy importing on a loaded machine
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"The portal did not answer /healthz within 60 s; see {logs}")
            time.sleep(0.2)
        yield portal
    finally:
        for process in portal.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in portal.processes.values():
            stop_process(process)
        for handle in handles:
            handle.close()


# --- data ----------------------------------------------------------------------------------------------------


@dataclass
class SeededCourse:
    tenant: Any
    course: Any
    labs: list[Any]
    students: list[Any]
    instructor: Any
    ta: Any


def seed_course(
    *,
    students: int,
    labs: int,
    name: str = "Bench University",
    checks_per_lab: int = 3,
    image: str = "quay.io/containerdisks/fedora:41",
) -> SeededCourse:
    """A tenant with generous quotas, one course, ``labs`` labs with checks, its staff and ``students``."""
    from django.contrib.auth.hashers import make_password

    from labs.models import Check, Lab
    from portal.models import Course, Membership, Role, Tenant, User

    tenant = Tenant.objects.create(
        name=name, max_concurrent_vms=10_000, max_vcpus=100_000, max_memory_mib=100_000 * 1024
    )
    course = Course.objects.create(tenant=tenant, code="BENCH101", title="Benchmarks", term="now")
    password = make_password(PASSWORD)  # hashed once: 500 PBKDF2 rounds would dominate the seeding
    prefix = tenant.namespace[-6:]
    people = User.objects.bulk_create(
        [
            User(
                username=f"student{index:04d}-{prefix}",
                password=password,
                tenant=tenant,
                full_name=f"Student {index:04d}",
                email=f"student{index:04d}@bench.test",
            )
            for index in range(students)
        ]
    )
    instructor = User.objects.create(
        username=f"instructor-{prefix}", password=password, tenant=tenant, full_name="Bench Instructor", is_staff=True
    )
    ta = User.objects.create(username=f"ta-{prefix}", password=password, tenant=tenant, full_name="Bench TA")
    Membership.objects.bulk_create(
        [Membership(user=person, course=course, role=Role.STUDENT) for person in people]
        + [
            Membership(user=instructor, course=course, role=Role.INSTRUCTOR),
            Membership(user=ta, course=course, role=Role.TA),
        ]
    )
    created_labs = [
        Lab.objects.create(
            course=course, title=f"Lab {index + 1:02d}", image=image, instructions=f"# Lab {index + 1}\n\nDo the thing."
        )
        for index in range(labs)
    ]
    Check.objects.bulk_create(
        [
            Check(lab=lab, order=order, title=f"Check {order}", command="true", points=1)
            for lab in created_labs
            for order in range(1, checks_per_lab + 1)
        ]
    )
    return SeededCourse(tenant=tenant, course=course, labs=created_labs, students=people, instructor=instructor, ta=ta)


def session_cookie(user: Any) -> str:
    """A logged-in session for ``user``, as the login form would create it."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def browser_headers(*, base_url: str, session_key: str, csrf_token: str) -> dict[str, str]:
    """Headers a logged-in page's fetch() sends: session and CSRF cookies, the CSRF header, JSON wanted."""
    from django.conf import settings

    return {
        "Cookie": f"{settings.SESSION_COOKIE_NAME}={session_key}; {settings.CSRF_COOKIE_NAME}={csrf_token}",
        "X-CSRFToken": csrf_token,
        "Accept": "application/json",
        "Origin": base_url,
        "Referer": base_url + "/",
    }


def new_csrf_token() -> str:
    from django.utils.crypto import get_random_string

    return get_random_string(32)
