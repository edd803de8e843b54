"""Drive an attempt through the real lifecycle services to ``running`` on kubesim, synchronously.

Provisioning and the namespace sync are called directly (Celery tasks are plain functions underneath), so a test
needs no worker; the VM, its VMI, the guest console and the agent health check are kubesim's real ones.
"""

from __future__ import annotations

import time

from labs.models import Attempt, AttemptState, Lab
from labs.services import attempt_provision, attempt_start, namespace_sync
from labs.services.agents import agents_check
from portal.models import User


def attempt_run_to(*, attempt: Attempt, state: str = AttemptState.RUNNING, timeout: float = 120.0) -> Attempt:
    """Sync the attempt's namespace until it reaches ``state`` (or fail with what it reached instead)."""
    deadline = time.monotonic() + timeout
    while True:
        attempt.refresh_from_db()
        if attempt.state == state:
            return attempt
        if attempt.state == AttemptState.FAILED or time.monotonic() > deadline:
            raise AssertionError(
                f"attempt {attempt.id} is {attempt.state} ({attempt.failure_reason or attempt.status_message}), "
                f"not {state}"
            )
        namespace_sync(namespace=attempt.namespace)
        if attempt.state == AttemptState.STARTING:
            # The agent's health check is its own task (await_agents) in production; here it is asked directly.
            agents_check(namespace=attempt.namespace)
        time.sleep(0.1)


def running_attempt(*, student: User, lab: Lab, timeout: float = 120.0) -> Attempt:
    """Start the lab for ``student`` and bring the attempt to running on the cluster the portal points at."""
    attempt = attempt_start(actor=student, lab=lab)
    attempt_provision(attempt_id=attempt.id)
    return attempt_run_to(attempt=attempt, timeout=timeout)
