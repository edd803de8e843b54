"""A live portal for browser tests and benchmarks: daphne serving ``ops.asgi:application`` and a Celery worker
(with beat), as subprocesses on 127.0.0.1, pointed at a given database, Redis and kubesim.

    with LivePortal(database_url=..., redis_url=..., kubeconfig=..., workdir=tmp_path) as portal:
        portal.url  # http://127.0.0.1:<port>

Each process runs in its own process group and is stopped (SIGTERM, then SIGKILL) on exit; logs stay in
``workdir`` and their tails are shown when a process fails to come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def subprocess_database_url() -> str:
    """The database Django uses now (the test database in tests), as a URL other processes can open."""
    from django.db import connection

    s = connection.settings_dict
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{s['USER']}{password}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LivePortal:
    def __init__(
        self,
        *,
        database_url: str,
        redis_url: str,
        kubeconfig: str | Path,
        workdir: str | Path,
        extra_env: dict[str, str] | None = None,
        worker: bool = True,
        startup_timeout: float = 60.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker = worker
        self.startup_timeout = startup_timeout
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []
        self.env = {
            **os.environ,
            "PORTAL_ENV": "test",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "KUBECONFIG": str(kubeconfig),
            "CONSOLE_RECORDINGS_DIR": str(self.workdir / "recordings"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        self.env.pop("KUBERNETES_SERVICE_HOST", None)

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )
        self.processes.append((name, process, log_path))
        return process

    def start(self) -> LivePortal:
        python = sys.executable
        try:
            self._spawn(
                "daphne", [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "ops.asgi:application"]
            )
            if self.worker:
                self._spawn(
                    "celery",
                    [
                        python,
                        "-m",
                        "celery",
                        "-A",
                        "portal",
                        "worker",
                        "--beat",
                        "--schedule",
                        str(self.workdir / "beat-schedule"),
                        "--pool",
                        "threads",
                        "--concurrency",
                        "4",
                        "--loglevel",
                        "INFO",
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                    ],
                )
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            for name, process, log_path in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not answer on {self.url}:\n{log_tail(self.workdir / 'daphne.log')}")
            time.sleep(0.2)

    def stop(self) -> None:
        for _, process, _ in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process, _ in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self.processes.clear()

    def logs(self) -> str:
        return "\n\n".join(f"== {path.stem} ==\n{log_tail(path)}" for path in sorted(self.workdir.glob("*.log")))

    def __enter__(self) -> LivePortal:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
