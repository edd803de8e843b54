"""The README's first command, end to end: the embedded default (SQLite, kubesim, in-process Celery worker and beat
on the in-memory transport) migrates, seeds, serves, and takes a student's lab from Start to running to graded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

BASE_DIR = Path(settings.BASE_DIR)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(var_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "KUBECONFIG", "PORTAL_ENV"}}
    env.update(PORTAL_VAR_DIR=str(var_dir), PORTAL_PORT=str(port), PORTAL_ENV="development", DEBUG="false")
    return env


def api(port: int, method: str, path: str, *, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", **({"Authorization": f"Token {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback URL built here)
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, ConnectionError):
        return 0, {}  # not listening (yet)


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


@dataclass
class RunningPortal:
    process: subprocess.Popen
    port: int
    var_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def seeded_var(tmp_path_factory) -> tuple[Path, str]:
    """A var directory migrated and seeded once per module; each portal runs on a copy of it."""
    var_dir = tmp_path_factory.mktemp("embedded") / "var"
    env = embedded_env(var_dir, free_port())
    manage = [sys.executable, str(BASE_DIR / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput"], env=env, check=True, capture_output=True, timeout=300)
    seeded = subprocess.run([*manage, "seed_demo"], env=env, check=True, capture_output=True, text=True, timeout=120)
    return var_dir, seeded.stdout


@contextlib.contextmanager
def running_portal(
    tmp_path: Path, seeded_var: tuple[Path, str], *args: str, env: dict[str, str] | None = None
) -> Iterator[RunningPortal]:
    """``manage.py run_portal`` on a copy of the seeded var directory, in a session of its own, until it answers."""
    port = free_port()
    var_dir = tmp_path / "var"
    shutil.copytree(seeded_var[0], var_dir)
    log_path = tmp_path / "portal.log"
    log = log_path.open("wb")
    # The sandboxed shell guest: this is the embedded flow under test; real VMs have tests of their own (marked vm).
    command = ["run_portal", "--kubesim-arg=--zero-delays", "--kubesim-arg=--guest=shell", *args]
    process = subprocess.Popen(
        [sys.executable, str(BASE_DIR / "manage.py"), *command],
        env={**embedded_env(var_dir, port), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    portal = RunningPortal(process=process, port=port, var_dir=var_dir, log_path=log_path)
    try:
        wait_for(
            lambda: api(port, "GET", "/healthz")[0] == 200 if process.poll() is None else "exited",
            timeout=60,
            what="the portal to answer /healthz",
        )
        assert process.poll() is None, portal.log()
        yield portal
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def embedded_portal(tmp_path, seeded_var):
    with running_portal(tmp_path, seeded_var) as portal:
        yield portal.port, seeded_var[1]


def test_embedded_default_starts_a_lab_and_grades_it(embedded_portal, tmp_path):
    port, seed_output = embedded_portal
    assert "student1" in seed_output and "student1-demo" in seed_output

    status, body = api(port, "POST", "/api/v1/auth/token/", body={"username": "student1", "password": "student1-demo"})
    assert status == 200, body
    token = body["token"]
    status, labs = api(port, "GET", "/api/v1/labs/", token=token)
    assert status == 200, labs
    lab = next(item for item in labs["results"] if item["title"] == "Linux basics")

    status, attempt = api(port, "POST", "/api/v1/attempts/", token=token, body={"lab": lab["id"]})
    assert status in (200, 201, 202), attempt

    def running():
        _, current = api(port, "GET", f"/api/v1/attempts/{attempt['id']}/", token=token)
        assert current.get("state") not in {"failed", "stopped", "expired"}, current
        return current if current.get("state") == "running" else None

    current = wait_for(running, timeout=90, what="the attempt to reach running")
    assert current["timestamps"]["vmi_running"] and current["timestamps"]["agent_ready"]

    # Nothing is done in the guest yet, so Check runs every check and the score is zero.
    status, run = api(port, "POST", f"/api/v1/attempts/{attempt['id']}/check/", token=token)
    assert status in (200, 201, 202), run

    def finished():
        _, current_run = api(port, "GET", f"/api/v1/grading-runs/{run['id']}/", token=token)
        return current_run if current_run.get("state") in {"done", "error"} else None

    done = wait_for(finished, timeout=60, what="the grading run to finish")
    assert done["state"] == "done", done
    assert float(done["score"]) == 0 and float(done["max_score"]) > 0

    status, stopped = api(port, "POST", f"/api/v1/attempts/{attempt['id']}/stop/", token=token)
    assert status in (200, 202), stopped
    wait_for(
        lambda: api(port, "GET", f"/api/v1/attempts/{attempt['id']}/", token=token)[1].get("state") == "stopped",
        timeout=60,
        what="the attempt to stop",
    )


# ---- faults: kubesim killed, shutdown with work in flight ----------------------------------------------------------


def child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            children += [int(child) for child in (task / "children").read_text().split()]
    return children


def kubesim_pids(portal: RunningPortal) -> list[int]:
    found = []
    for pid in child_pids(portal.process.pid):
        with contextlib.suppress(FileNotFoundError):
            if b"kubesim" in Path(f"/proc/{pid}/cmdline").read_bytes() and process_state(pid) != "Z":
                found.append(pid)
    return found


def process_state(pid: int) -> str | None:
    """The process's state letter (``Z``: defunct), or None once it is gone (reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def student_token(port: int) -> str:
    status, body = api(port, "POST", "/api/v1/auth/token/", body={"username": "student1", "password": "student1-demo"})
    assert status == 200, body
    return body["token"]


@contextlib.contextmanager
def database_write_locked(portal: RunningPortal) -> Iterator[None]:
    """Hold SQLite's write lock, so that a request that writes waits for it (is in flight) meanwhile."""
    connection = sqlite3.connect(portal.var_dir / "portal.sqlite3", timeout=10, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def start_a_lab_in_a_thread(port: int, token: str) -> threading.Thread:
    _, labs = api(port, "GET", "/api/v1/labs/", token=token)
    lab = next(item for item in labs["results"] if item["title"] == "Linux basics")
    thread = threading.Thread(
        target=api,
        args=(port, "POST", "/api/v1/attempts/"),
        kwargs={"token": token, "body": {"lab": lab["id"]}},
        daemon=True,
    )
    thread.start()
    return thread


def exited_within(process: subprocess.Popen, seconds: float) -> float | None:
    began = time.monotonic()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - began


def test_kubesim_killed_is_started_again_with_a_note_and_labs_start_on_it(tmp_path, seeded_var):
    with running_portal(tmp_path, seeded_var) as portal:
        (first,) = kubesim_pids(portal)
        os.kill(first, signal.SIGKILL)

        def restarted():
            others = [pid for pid in kubesim_pids(portal) if pid != first]
            return others if others and api(portal.port, "GET", "/readyz?exclude=sync")[0] == 200 else None

        wait_for(restarted, timeout=60, what="kubesim to be started again and answer")
        assert process_state(first) is None, "the killed kubesim was left defunct"
        assert "kubesim, the portal's cluster, exited on signal 9; starting it again" in portal.log()
        assert portal.process.poll() is None

        # The portal reads the new kubesim's kubeconfig (a new token): a lab starts on it.
        token = student_token(portal.port)
        _, labs = api(portal.port, "GET", "/api/v1/labs/", token=token)
        lab = next(item for item in labs["results"] if item["title"] == "Linux basics")
        status, attempt = api(portal.port, "POST", "/api/v1/attempts/", token=token, body={"lab": lab["id"]})
        assert status in (200, 201, 202), attempt
        wait_for(
            lambda: (
                api(portal.port, "GET", f"/api/v1/attempts/{attempt['id']}/", token=token)[1].get("state") == "running"
            ),
            timeout=90,
            what="the attempt to run on the new kubesim",
        )


def test_sigterm_with_a_request_in_flight_ends_the_portal_within_its_grace(tmp_path, seeded_var):
    with running_portal(tmp_path, seeded_var, env={"PORTAL_SHUTDOWN_GRACE_SECONDS": "3"}) as portal:
        token = student_token(portal.port)
        kubesim = kubesim_pids(portal)
        with database_write_locked(portal):
            start_a_lab_in_a_thread(portal.port, token)
            time.sleep(1.5)  # the Start waits for the database meanwhile
            portal.process.send_signal(signal.SIGTERM)
            took = exited_within(portal.process, 10)
        assert took is not None, "the portal did not exit within 10 s of SIGTERM"
        assert "exiting without waiting for them" in portal.log()
        assert all(process_state(pid) in (None, "Z") for pid in kubesim), "kubesim was left running"


def test_a_second_sigterm_ends_the_portal_at_once(tmp_path, seeded_var):
    with running_portal(tmp_path, seeded_var, env={"PORTAL_SHUTDOWN_GRACE_SECONDS": "60"}) as portal:
        token = student_token(portal.port)
        kubesim = kubesim_pids(portal)
        with database_write_locked(portal):
            start_a_lab_in_a_thread(portal.port, token)
            time.sleep(1.5)
            portal.process.send_signal(signal.SIGTERM)
            assert exited_within(portal.process, 1) is None  # the first one waits for the request in flight
            portal.process.send_signal(signal.SIGTERM)
            took = exited_within(portal.process, 6)
        assert took is not None, "a second SIGTERM did not end the portal"
        assert "SIGTERM received again: exiting now" in portal.log()
        assert all(process_state(pid) in (None, "Z") for pid in kubesim), "kubesim was left running"
