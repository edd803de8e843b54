"""Keeping the embedded default's kubesim alive under ``manage.py run_portal``: when it exits unexpectedly it is
started again on the same ports, with a note in the log; when it keeps exiting the portal is stopped with a clear
message. kubesim keeps its objects in memory, so the VMs it ran are gone after a restart."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import yaml

logger = logging.getLogger(__name__)

# More exits than this within RESTART_WINDOW_SECONDS and kubesim is not started again: something is wrong that a
# restart does not mend (a port taken, a broken install), and the portal stops rather than run without a cluster.
MAX_RESTARTS = 3
RESTART_WINDOW_SECONDS = 60.0
SHUTDOWN_NOTICE_SECONDS = 1.0


def served_port(kubeconfig: Path) -> int | None:
    """The port of the server a kubeconfig written by kubesim points at, or None if it cannot be read."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        return urlsplit(config["clusters"][0]["cluster"]["server"]).port
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
        return None


def stop_child(process: subprocess.Popen, *, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; the child is reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class KubesimSupervisor:
    """Watches one kubesim child in a thread of its own: ``start(extra_args)`` returns once it serves, ``restarted()``
    follows each restart (the kubeconfig's token is new), ``give_up(message)`` when it is not started again."""

    def __init__(
        self,
        *,
        start: Callable[[list[str]], subprocess.Popen],
        restarted: Callable[[], None],
        give_up: Callable[[str], None],
        kubeconfigs: tuple[Path, ...],
        log_path: Path,
        max_restarts: int = MAX_RESTARTS,
        window_seconds: float = RESTART_WINDOW_SECONDS,
    ) -> None:
        self._start = start
        self._restarted = restarted
        self._give_up = give_up
        self._kubeconfigs = kubeconfigs
        self._log_path = log_path
        self._max_restarts = max_restarts
        self._window_seconds = window_seconds
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._ports: list[int | None] = []
        self.gave_up: str | None = None

    def run(self) -> None:
        """Start kubesim now (errors reach the caller) and watch it from then on."""
        self._process = self._start([])
        self._ports = [served_port(path) for path in self._kubeconfigs]
        threading.Thread(target=self._watch, name="kubesim-supervisor", daemon=True).start()

    def shutting_down(self) -> None:
        """The portal is stopping: kubesim is not started again if it exits now (a Ctrl-C reaches it as well)."""
        self._stopping.set()

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop kubesim for good (the portal is shutting down)."""
        self._stopping.set()
        # A restart under way holds the lock while kubesim comes up; it stops what it started once it sees this.
        locked = self._lock.acquire(timeout=timeout)
        try:
            if self._process is not None:
                stop_child(self._process, timeout=timeout)
        finally:
            if locked:
                self._lock.release()

    def _same_ports(self) -> list[str]:
        http_port, https_port = (self._ports + [None, None])[:2]
        args = ["--port", str(http_port)] if http_port else []
        return args + (["--tls-port", str(https_port)] if https_port else [])

    def _watch(self) -> None:
        exits: list[float] = []
        while not self._stopping.is_set():
            process = self._process
            status = process.wait() if process is not None else None
            # A Ctrl-C in the terminal reaches kubesim and the portal together: give the portal's shutdown a moment
            # to say so before taking the exit for a crash.
            if self._stopping.wait(SHUTDOWN_NOTICE_SECONDS):
                return
            now = time.monotonic()
            exits = [at for at in exits if at > now - self._window_seconds] + [now]
            if status is None:
                how = "before it served"
            else:
                how = f"with status {status}" if status >= 0 else f"on signal {-status}"
            if len(exits) > self._max_restarts:
                self.gave_up = (
                    f"kubesim, the portal's cluster, exited {how}, {len(exits)} times within "
                    f"{self._window_seconds:g} s; stopping the portal rather than running without a "
                    f"cluster. See {self._log_path}."
                )
                logger.critical(self.gave_up)
                self._give_up(self.gave_up)
                return
            logger.error(
                "kubesim, the portal's cluster, exited %s; starting it again on the same port. It keeps its "
                "objects in memory: the VMs of running labs are gone, and their attempts will fail. "
                "(kubesim's log: %s)",
                how,
                self._log_path,
            )
            try:
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self._process = self._start(self._same_ports())
                    if self._stopping.is_set():
                        stop_child(self._process, timeout=3)
                        return
            except Exception as exc:
                logger.error("kubesim could not be started again: %s", exc)
                self._process = None
                continue
            self._restarted()
            logger.warning("kubesim started again (pid %s)", self._process.pid)
