"""Row locks under a class acting at once (PostgreSQL): one student stopping, extending or checking must not
block another student's start in the same lab, and a start in progress must not block their audit records. Found
by the soak, where six students acting together deadlocked: a stop held its lab and course rows ``FOR UPDATE``
(through ``select_related``) while a start, holding its tenant row, needed a key-share lock on that lab row for
the new attempt's foreign key, and the stop's audit record needed one on the tenant row."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from grading.services import grading_run_request
from labs.models import Attempt, AttemptState
from labs.services import attempt_extend, attempt_start, attempt_stop
from labs.tests.reliability import flush_redis, make_course, make_lab, make_students, make_tenant

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(60),
    # SQLite has one writer at a time: there the second transaction waits for the first by design.
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row locks"),
]

LOCK_WAIT = "2s"


@pytest.fixture
def lab(transactional_db):
    flush_redis()
    yield make_lab(make_course(make_tenant("Locks University", vms=20)))
    flush_redis()


def running_attempt(student, lab) -> Attempt:
    """A running attempt as the database knows it (row locks are all this test is about: no VM needed)."""
    attempt = attempt_start(actor=student, lab=lab)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.RUNNING, agent_ready_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1)
    )
    attempt.refresh_from_db()
    return attempt


def while_held(hold: Callable[[], object], then: Callable[[], object]) -> object:
    """Run ``hold`` in a transaction left open in another thread, then ``then`` here with a short lock timeout:
    a lock conflict shows up as an error within seconds instead of a wait."""
    held, release, failure = threading.Event(), threading.Event(), []

    def holder() -> None:
        try:
            with transaction.atomic():
                hold()
                held.set()
                release.wait(timeout=20)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failure.append(exc)
            held.set()
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(timeout=10)
        assert not failure, failure
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
            return then()
    finally:
        release.set()
        thread.join(timeout=20)


@pytest.mark.parametrize("action", ["stop", "extend", "check"])
def test_a_students_stop_extend_or_check_does_not_block_a_classmates_start(lab, action):
    (acting, starting) = make_students(lab.course, 2)
    attempt = running_attempt(acting, lab)
    hold = {
        "stop": lambda: attempt_stop(actor=acting, attempt=attempt),
        "extend": lambda: attempt_extend(actor=acting, attempt=attempt),
        "check": lambda: grading_run_request(actor=acting, attempt=attempt),
    }[action]
    started = while_held(hold, lambda: attempt_start(actor=starting, lab=lab))
    assert Attempt.objects.get(pk=started.pk).state == AttemptState.REQUESTED


@pytest.mark.parametrize("action", ["stop", "extend", "check"])
def test_a_start_in_progress_does_not_block_a_classmates_stop_extend_or_check(lab, action):
    (acting, starting) = make_students(lab.course, 2)
    attempt = running_attempt(acting, lab)
    act = {
        "stop": lambda: attempt_stop(actor=acting, attempt=attempt),
        "extend": lambda: attempt_extend(actor=acting, attempt=attempt),
        "check": lambda: grading_run_request(actor=acting, attempt=attempt),
    }[action]
    while_held(lambda: attempt_start(actor=starting, lab=lab), act)
