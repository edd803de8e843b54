"""What ``manage.py run_portal`` needs around the embedded default: the guest its kubesim runs (with the reason),
kubesim kept alive (restarted on the same ports, or the portal stopped with a clear message), and a bounded shutdown."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from django.conf import settings

logger = logging.getLogger(__name__)

QEMU = "qemu-system-x86_64"
SEED_TOOL = "genisoimage"
SANDBOX_TOOL = "bwrap"


class GuestUnavailable(Exception):
    """Neither guest can run here; the message says what to install."""


@dataclass(frozen=True)
class GuestChoice:
    guest: str
    reason: str
    kubesim_args: tuple[str, ...]


def image_build_script() -> Path:
    return Path(settings.BASE_DIR) / "guest" / "image" / "build"


def cached_guest_image() -> Path | None:
    """The lab guest image for the current recipe if it is built already (building takes minutes: not here)."""
    result = subprocess.run([str(image_build_script()), "--cached-only"], capture_output=True, text=True)
    path = result.stdout.strip()
    return Path(path) if result.returncode == 0 and path else None


def guest_choice(kubesim_args: list[str]) -> GuestChoice:
    """The guest for the embedded kubesim, given the extra kubesim arguments the operator passed."""
    if any(arg == "--guest" or arg.startswith("--guest=") for arg in kubesim_args):
        return GuestChoice("as given", "chosen with --kubesim-arg", ())
    missing = [tool for tool in (QEMU, SEED_TOOL) if shutil.which(tool) is None]
    image = None if missing else cached_guest_image()
    if image is None:
        if missing:
            why = f"{' and '.join(missing)} not installed (apt-get install qemu-system-x86 genisoimage for real VMs)"
        else:
            why = f"QEMU is installed but the lab guest image is not built yet (run {image_build_script()}, once)"
        if shutil.which(SANDBOX_TOOL) is None:
            raise GuestUnavailable(
                f"No guest can run here: the sandboxed shell needs bubblewrap (apt-get install "
                f"bubblewrap), and real VMs are out: {why}. --kubesim-arg=--guest=none gives "
                "a loopback console without a guest."
            )
        return GuestChoice("shell", why, ("--guest=shell",))
    return GuestChoice(
        "vm", f"QEMU is installed and the lab guest image is built ({image})", ("--guest=vm", f"--guest-image={image}")
    )


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


@dataclass(kw_only=True, eq=False)
class KubesimSupervisor:
    """Watches one kubesim child in a thread of its own: ``start(extra_args)`` returns once it serves, ``restarted()``
    follows each restart (a new token; kubesim's objects were in memory, so its VMs are gone), ``give_up(message)``
    when it is not started again."""

    start: Callable[[list[str]], subprocess.Popen]
    restarted: Callable[[], None]
    give_up: Callable[[str], None]
    kubeconfigs: tuple[Path, ...]
    log_path: Path
    max_restarts: int = MAX_RESTARTS
    gave_up: str | None = field(default=None, init=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _process: subprocess.Popen | None = field(default=None, init=False)
    _restart_args: list[str] = field(default_factory=list, init=False)

    def run(self) -> None:
        """Start kubesim now (errors reach the caller) and watch it from then on."""
        self._process = self.start([])
        # A restart serves on the same ports: the kubeconfigs name the HTTP one, then the HTTPS one.
        ports = zip(("--port", "--tls-port"), [served_port(path) for path in self.kubeconfigs], strict=False)
        self._restart_args = [arg for flag, port in ports if port for arg in (flag, str(port))]
        threading.Thread(target=self._watch, name="kubesim-supervisor", daemon=True).start()

    def shutting_down(self) -> None:
        """The portal is stopping: kubesim is not started again if it exits now (a Ctrl-C reaches it as well)."""
        self._stopping.set()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stopping.set()
        # A restart under way holds the lock while kubesim comes up; it stops what it started once it sees this.
        locked = self._lock.acquire(timeout=timeout)
        try:
            if self._process is not None:
                stop_child(self._process, timeout=timeout)
        finally:
            if locked:
                self._lock.release()

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
            exits = [at for at in exits if at > now - RESTART_WINDOW_SECONDS] + [now]
            if status is None:
                how = "before it served"
            else:
                how = f"with status {status}" if status >= 0 else f"on signal {-status}"
            if len(exits) > self.max_restarts:
                self.gave_up = (
                    f"kubesim, the portal's cluster, exited {how}, {len(exits)} times within "
                    f"{RESTART_WINDOW_SECONDS:g} s; stopping the portal rather than running without a "
                    f"cluster. See {self.log_path}."
                )
                logger.critical(self.gave_up)
                self.give_up(self.gave_up)
                return
            logger.error(
                "kubesim, the portal's cluster, exited %s; starting it again on the same port. It keeps its "
                "objects in memory: the VMs of running labs are gone, and their attempts will fail. "
                "(kubesim's log: %s)",
                how,
                self.log_path,
            )
            try:
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self._process = self.start(self._restart_args)
                    if self._stopping.is_set():
                        stop_child(self._process, timeout=3)
                        return
            except Exception as exc:
                logger.error("kubesim could not be started again: %s", exc)
                self._process = None
                continue
            self.restarted()
            logger.warning("kubesim started again (pid %s)", self._process.pid)


# The exit status of a shutdown cut short: something was still running when the process ended.
FORCED_EXIT_STATUS = 1


class BoundedShutdown:
    """``begin()`` starts the clock; ``cleanup`` stops child processes before a forced exit (no ``atexit`` then)."""

    def __init__(self, *, grace_seconds: float, cleanup: Callable[[], None]) -> None:
        self.grace_seconds = grace_seconds
        self.cleanup = cleanup
        self._begun = threading.Event()
        self._exiting = threading.Lock()

    def begin(self) -> None:
        """Called in the main thread as the server begins to shut down. Idempotent."""
        if self._begun.is_set():
            return
        self._begun.set()
        logger.warning(
            "shutting down: what is in flight has %g s to finish (a second SIGTERM or Ctrl-C ends it now)",
            self.grace_seconds,
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signalled_again)
        # A daemon thread keeps counting while the interpreter waits for the other threads at exit.
        threading.Thread(target=self._deadline, name="shutdown-deadline", daemon=True).start()

    def _signalled_again(self, signum: int, _frame: object) -> None:
        self.exit_now(f"{signal.Signals(signum).name} received again: exiting now")

    def _deadline(self) -> None:
        threading.Event().wait(self.grace_seconds)
        busy = sorted(
            thread.name
            for thread in threading.enumerate()
            if thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
        )
        self.exit_now(
            f"still busy {self.grace_seconds:g} s after the shutdown began "
            f"(threads: {', '.join(busy) or 'the main thread'}); exiting without waiting for them"
        )

    def exit_now(self, reason: str) -> None:
        """Stop the children, say why, and end the process without waiting for any thread."""
        if not self._exiting.acquire(blocking=False):
            return  # already on its way out
        logger.error("shutdown: %s", reason)
        try:
            self.cleanup()
        except Exception:
            logger.exception("shutdown: stopping the child processes failed")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken stream must not keep us alive
                stream.flush()
        os._exit(FORCED_EXIT_STATUS)
