"""The README's first command, end to end: the embedded default (SQLite, kubesim, in-process Celery worker and beat
on the in-memory transport) migrates, seeds, serves, and takes a student's lab from Start to running to graded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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
        f"http://127.0.0.1:{port}{path}", method=method,
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


@pytest.fixture
def embedded_portal(tmp_path):
    port = free_port()
    env = embedded_env(tmp_path / "var", port)
    manage = [sys.executable, str(BASE_DIR / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput"], env=env, check=True, capture_output=True, timeout=180)
    seeded = subprocess.run([*manage, "seed_demo"], env=env, check=True, capture_output=True, text=True, timeout=60)
    log = (tmp_path / "portal.log").open("wb")
    process = subprocess.Popen(
        [*manage, "run_portal", "--kubesim-arg=--zero-delays"], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: api(port, "GET", "/healthz")[0] == 200 if process.poll() is None else "exited",
                 timeout=60, what="the portal to answer /healthz")
        assert process.poll() is None, (tmp_path / "portal.log").read_text()
        yield port, seeded.stdout
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


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
    wait_for(lambda: api(port, "GET", f"/api/v1/attempts/{attempt['id']}/", token=token)[1].get("state") == "stopped",
             timeout=60, what="the attempt to stop")
