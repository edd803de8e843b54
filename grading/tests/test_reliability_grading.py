"""Grading when the agent hangs or dies mid-run, and when the worker running a check dies: the run ends in
``error`` with a reason, no partial score is counted, and the student can check again. The agent is the real one
in kubesim's guest; it is frozen (SIGSTOP) or killed (SIGKILL) as a hung or crashed guest service would be."""

from __future__ import annotations

import os
import signal
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection

from grading.models import CheckResult, Grade, GradingRun, RunState
from grading.services import grading_run_request, grading_runs_fail_stale
from grading.tasks import grading_run_execute
from labs import agent_client, tasks
from labs.models import Attempt, AttemptState, Check
from labs.services import attempt_start, attempt_stop
from labs.tests.reliability import (
    clock_fixture,
    cluster_fixture,
    drive_to,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    vm_names,
    wait_until,
)
from portal.errors import Conflict

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(150)]


kubesim = kubesim_fixture("grading")
cluster = cluster_fixture(GRADING_MIN_INTERVAL_SECONDS=0)
clock = clock_fixture()


@pytest.fixture
def attempt(cluster) -> Attempt:
    """A running attempt whose student did the work (hello.txt written in the guest's home), with 1 s checks so
    that a hung agent costs the run's deadline of seconds, not minutes."""
    lab = make_lab(make_course(make_tenant("Grading Reliability")), check_timeout_s=1)
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    assert tasks.provision_attempt(attempt.id) == "created"
    drive_to(attempt, AttemptState.RUNNING)
    guest = cluster.admin.guest(attempt.namespace, attempt.vm_name)
    (Path(guest["home"]) / "hello.txt").write_text("hello world\n")
    return attempt


def agent_pid(cluster, attempt: Attempt) -> int:
    guest = cluster.admin.guest(attempt.namespace, attempt.vm_name)
    assert guest["agent_pid"], guest
    return int(guest["agent_pid"])


def check(attempt: Attempt) -> GradingRun:
    """The student presses Check and a worker runs the task it queued."""
    run = grading_run_request(actor=attempt.student, attempt=attempt)
    grading_run_execute(run.id)
    run.refresh_from_db()
    return run


def grade_of(attempt: Attempt) -> Grade:
    return Grade.objects.get(lab=attempt.lab, student=attempt.student)


def test_a_hung_or_killed_agent_ends_the_run_in_error_and_the_grade_keeps_the_last_full_run(cluster, attempt):
    done = check(attempt)
    assert (done.state, done.score, done.max_score) == (RunState.DONE, Decimal(3), Decimal(3))
    assert grade_of(attempt).source_run_id == done.id

    # The agent hangs (its sandbox's processes frozen): the run gives up at its deadline, in error, with nothing
    # counted.
    group = os.getpgid(agent_pid(cluster, attempt))
    os.killpg(group, signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = check(attempt)
        took = time.monotonic() - started
    finally:
        os.killpg(group, signal.SIGCONT)
    deadline = agent_client.deadline_for_checks(list(Check.objects.filter(lab=attempt.lab)))
    assert (hung.state, hung.error_code) == (RunState.ERROR, "agent_timeout")
    assert hung.error_message == "The checks did not finish in time."
    # The run gives up at its deadline (15 s here); a second try would wait as long again, a run without one for ever.
    # 10 s beyond it leaves a loaded host room for the run's bookkeeping and the portforward's opening.
    assert took <= deadline + 10, (took, deadline)
    assert hung.score is None and not CheckResult.objects.filter(run=hung).exists()
    assert grade_of(attempt).source_run_id == done.id and grade_of(attempt).score == Decimal(3)

    # The agent answers again: the student checks again, straight away, and gets a full result.
    again = check(attempt)
    assert (again.state, again.score) == (RunState.DONE, Decimal(3))

    # The agent dies in the middle of a run: the run ends in error, no partial result is kept.
    began = Path(cluster.admin.guest(attempt.namespace, attempt.vm_name)["home"]) / "second-began"
    Check.objects.filter(lab=attempt.lab, order=2).update(
        command=f"touch ~/{began.name}; sleep 10; cat ~/hello.txt", timeout_s=20
    )
    run = grading_run_request(actor=attempt.student, attempt=attempt)
    worker = threading.Thread(target=lambda: (grading_run_execute(run.id), connection.close()))
    worker.start()
    # The first check has answered inside the guest, the second sleeps: the agent is killed with a result in hand.
    wait_until(began.exists, timeout=30, what="the second check to begin")
    os.killpg(os.getpgid(agent_pid(cluster, attempt)), signal.SIGKILL)
    worker.join(timeout=30)
    run.refresh_from_db()
    assert run.state == RunState.ERROR and run.error_code in ("agent_not_answering", "agent_bad_response"), (
        run.state,
        run.error_code,
        run.error,
    )
    assert run.error_message and run.score is None
    assert not CheckResult.objects.filter(run=run).exists()
    assert grade_of(attempt).score == Decimal(3)

    # Nothing blocks the next press: it is accepted and ends with a reason the student can read.
    after = check(attempt)
    assert after.state == RunState.ERROR and after.error_message
    # Stopping grades once more before the VM goes: with the agent dead that run errs, and the VM goes anyway.
    attempt_stop(actor=attempt.student, attempt=attempt)
    assert tasks.teardown_attempt(attempt.id) == "deleted"
    final = GradingRun.objects.get(attempt=attempt, trigger="stop")
    assert final.state == RunState.ERROR and final.score is None
    drive_to(attempt, AttemptState.STOPPED)
    wait_until(lambda: vm_names(attempt.namespace) == [], timeout=20, what="the VM to go")
    grade = grade_of(attempt)
    # The best full run counts (the first of two equal ones), never an errored or partial one.
    assert (grade.score, grade.source_run_id) == (Decimal(3), done.id)


def test_a_run_whose_worker_died_is_failed_at_its_deadline_and_the_student_can_check_again(cluster, attempt, clock):
    run = grading_run_request(actor=attempt.student, attempt=attempt)
    # The worker took the run and was SIGKILLed: the run says "running" and nothing will finish it.
    GradingRun.objects.filter(pk=run.pk).update(state=RunState.RUNNING, started_at=clock.now())
    with pytest.raises(Conflict) as busy:
        grading_run_request(actor=attempt.student, attempt=attempt)
    assert busy.value.message == "A check of this attempt is already in progress."
    assert grading_runs_fail_stale() == 0

    deadline = agent_client.deadline_for_checks(list(Check.objects.filter(lab=attempt.lab)))
    clock.advance(seconds=deadline + 61)
    assert grading_runs_fail_stale() == 1  # the beat's grading sweep
    run.refresh_from_db()
    assert (run.state, run.error_code, run.score) == (RunState.ERROR, "interrupted", None)
    assert run.error_message == "The check was interrupted before it finished. Check again."

    again = check(attempt)
    assert (again.state, again.score) == (RunState.DONE, Decimal(3))
    assert grade_of(attempt).source_run_id == again.id
    # A press whose worker never came at all is cleared the same way, at the queued limit.
    queued = grading_run_request(actor=attempt.student, attempt=attempt)
    clock.advance(minutes=10)
    replacement = grading_run_request(actor=attempt.student, attempt=attempt)
    queued.refresh_from_db()
    assert (queued.state, queued.error_code) == (RunState.ERROR, "interrupted")
    assert replacement.state == RunState.QUEUED
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.RUNNING
