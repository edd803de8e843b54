"""A bounded shutdown for ``manage.py run_portal``: after SIGTERM or SIGINT, what is in flight (requests, tasks)
gets a grace period, then the process exits whatever still runs; a second signal exits at once. Child processes
are stopped first either way."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

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
