"""The follow-up after a VM is created: one list, then one watch of the namespace's VMIs while attempts in it come
up, so a VMI that reaches Running is applied at once rather than at the next list."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import make_person
from labs.models import AttemptState
from labs.services import attempt_start, tracking
from portal.models import Role

pytestmark = pytest.mark.django_db(transaction=True)


def requests_by_verb(cluster) -> dict[str, int]:
    return cluster.admin.counters()["by_verb_resource"]


@pytest.fixture
def slow_boot(lifecycle):
    """VMIs stay Scheduled for a second before Running: a list made right after the VM sees it still booting."""
    lifecycle.admin.configure(scheduled_delay=1.0)
    yield lifecycle
    lifecycle.admin.configure(scheduled_delay=0)


def test_follow_up_watches_until_the_vmi_runs_then_stops(slow_boot, settings, student_a, lab_a):
    settings.ATTEMPT_FOLLOW_WATCH_SECONDS = 20
    attempt = attempt_start(actor=student_a, lab=lab_a)  # eager tasks: the VM is created before this returns
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING and attempt.vmi_running_at is None
    slow_boot.admin.reset_counters()

    started = time.monotonic()
    report = tracking.namespace_sync(namespace=attempt.namespace, follow=True)
    took = time.monotonic() - started

    attempt.refresh_from_db()
    assert attempt.vmi_running_at is not None and attempt.phase == "Running"
    assert report.awaiting_agent + report.changed >= 1
    # It ended once nothing was coming up, long before its 20 s, having spent one list and one watch.
    assert 0.5 < took < 10, took
    counts = requests_by_verb(slow_boot)
    assert counts.get("list virtualmachineinstances") == 1, counts
    assert counts.get("watch virtualmachineinstances") == 1, counts


def test_follow_up_watch_picks_up_starts_made_while_it_runs(slow_boot, settings, student_a, lab_a, tenant_a,
                                                            course_a):
    settings.ATTEMPT_FOLLOW_WATCH_SECONDS = 20
    first = attempt_start(actor=student_a, lab=lab_a)
    classmate = make_person(username="classmate", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    outcome: dict = {}

    def follow() -> None:
        from django.db import connection

        try:
            outcome["report"] = tracking.namespace_sync(namespace=first.namespace, follow=True)
        finally:
            connection.close()

    watcher = threading.Thread(target=follow)
    watcher.start()
    time.sleep(0.3)
    second = attempt_start(actor=classmate, lab=lab_a)  # its VM is made while the watch runs
    watcher.join(timeout=15)
    assert not watcher.is_alive()
    for attempt in (first, second):
        attempt.refresh_from_db()
        assert attempt.vmi_running_at is not None, attempt.id


def test_no_watch_without_the_setting_or_a_free_slot(slow_boot, settings, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    settings.ATTEMPT_FOLLOW_WATCH_SECONDS = 0
    slow_boot.admin.reset_counters()
    tracking.namespace_sync(namespace=attempt.namespace, follow=True)
    assert "watch virtualmachineinstances" not in requests_by_verb(slow_boot)

    settings.ATTEMPT_FOLLOW_WATCH_SECONDS = 20
    held = [tracking._watch_slots.acquire(blocking=False) for _ in range(tracking.ATTEMPT_WATCH_SLOTS)]
    try:
        assert all(held)
        tracking.namespace_sync(namespace=attempt.namespace, follow=True)
    finally:
        for _ in held:
            tracking._watch_slots.release()
    assert "watch virtualmachineinstances" not in requests_by_verb(slow_boot)
