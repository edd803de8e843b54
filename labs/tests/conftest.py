"""Fixtures for lifecycle tests: Celery tasks run in-process, the session's kubesim as the cluster, helpers that
drive the sync until an attempt reaches a state, and starts pressed at the same moment."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from labs.kubevirt import operations
from labs.models import Attempt
from labs.services import tracking
from portal.models import Tenant


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """``task.delay()`` runs the task at once in this thread (no broker, no worker): what a worker would do."""
    from portal.celery import app

    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved


@pytest.fixture
def lifecycle(cluster, settings, eager_tasks) -> Iterator[object]:
    """kubesim as the cluster, tasks eager, no follow-up listings (tests drive the sync), no failure grace.
    Afterwards every VM left in the test's tenant namespaces is deleted, so guests do not pile up."""
    settings.ATTEMPT_FOLLOW_UP_SECONDS = ()
    # Personas are made after this fixture; hashing their passwords slowly would dominate the test time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 0
    settings.ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS = 0
    yield cluster
    for namespace in Tenant.objects.values_list("namespace", flat=True):
        try:
            for vm in operations.vms_list(namespace=namespace):
                operations.vm_delete(namespace=namespace, name=vm["metadata"]["name"])
        except operations.ClusterError:
            pass


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float = 20.0,
    step: Callable[[], None] | None = None,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            step()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def sync_until(attempt: Attempt, states: str | tuple[str, ...], *, timeout: float = 20.0) -> Attempt:
    """Run the sync (as the beat would) until the attempt is in one of ``states``."""
    wanted = (states,) if isinstance(states, str) else states

    def reached() -> bool:
        attempt.refresh_from_db()
        return attempt.state in wanted

    try:
        wait_until(
            reached,
            timeout=timeout,
            step=lambda: tracking.namespace_sync(namespace=attempt.namespace),
            what=f"attempt {attempt.id} to reach {wanted}",
        )
    except AssertionError as error:
        raise AssertionError(f"{error} (at the end {attempt.state}: {attempt.status_message!r})") from None
    return attempt


def vm_names(namespace: str) -> list[str]:
    return sorted(vm["metadata"]["name"] for vm in operations.vms_list(namespace=namespace))


def start_together(starts: list[tuple[object, object]], *, timeout: float = 120.0) -> list[object]:
    """Press Start for each ``(student, lab)`` at the same moment, each in a thread with its own database connection
    (the test needs ``django_db(transaction=True)``). Returns what each got, in order: its ``Attempt``, or the
    exception it raised (a refusal, or anything else, for the test to show)."""
    from labs.services import attempt_start

    barrier = threading.Barrier(len(starts))
    outcomes: list[object] = [None] * len(starts)

    def press_start(index: int, student, lab) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[index] = attempt_start(actor=student, lab=lab)
        except Exception as error:
            outcomes[index] = error
        finally:
            connection.close()

    threads = [
        threading.Thread(target=press_start, args=(index, student, lab)) for index, (student, lab) in enumerate(starts)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return outcomes
