"""Duplicate delivery: Celery delivers at least once (``acks_late``, a visibility timeout passing, a worker lost
mid-task), so the provisioning, teardown and grading tasks arrive twice at the same moment and once more after
they succeeded. Exactly one VM, one final run, one grading run with its results, one grade."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from grading import tasks as grading_tasks
from grading.models import CheckResult, Grade, GradingRun, RunState
from grading.services import grading_run_request
from labs import tasks
from labs.kubevirt import operations
from labs.models import Attempt, AttemptState
from labs.services import attempt_start, attempt_stop, stopping
from labs.tests.reliability import (
    cluster_fixture,
    drive_to,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    vm_names,
    vms_by_name,
    wait_until,
)
from portal.errors import Conflict

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.embedded_db,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


kubesim = kubesim_fixture("duplicates")
cluster = cluster_fixture(GRADING_MIN_INTERVAL_SECONDS=0)


def at_once(*calls: Callable[[], object]) -> list[object]:
    """Run the calls in threads released together (two workers taking the same message); return their results."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(index: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test, which asserts on it
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.fixture
def lab():
    return make_lab(make_course(make_tenant("Duplicates University")))


def test_start_delivered_twice_at_once_and_again_later_makes_one_vm(cluster, lab):
    (student, other) = make_students(lab.course, 2)
    # The student double-clicks Start: one attempt, the second press is refused in words.
    pressed = at_once(lambda: attempt_start(actor=student, lab=lab), lambda: attempt_start(actor=student, lab=lab))
    started = [r for r in pressed if isinstance(r, Attempt)]
    refused = [r for r in pressed if isinstance(r, Conflict)]
    assert len(started) == 1 and len(refused) == 1, pressed
    assert refused[0].message == "You already have an attempt of this lab in progress."
    attempt = started[0]

    outcomes = at_once(lambda: tasks.provision_attempt(attempt.id), lambda: tasks.provision_attempt(attempt.id))
    assert sorted(map(str, outcomes)) in (["abandoned", "created"], ["created", "created"], ["created", "skipped"]), (
        outcomes
    )
    first_uid = vms_by_name(attempt.namespace)[attempt.vm_name]["metadata"]["uid"]
    drive_to(attempt, AttemptState.RUNNING)
    # Redelivered after it succeeded (a visibility timeout passing): nothing happens.
    assert tasks.provision_attempt(attempt.id) == "skipped"
    assert vm_names(attempt.namespace) == [attempt.vm_name]
    assert vms_by_name(attempt.namespace)[attempt.vm_name]["metadata"]["uid"] == first_uid
    assert cluster.admin.counters()["by_verb_resource"].get("create virtualmachines", 0) >= 1

    # Another student's attempt, provisioned once, is untouched by all of this.
    second = attempt_start(actor=other, lab=lab)
    assert tasks.provision_attempt(second.id) == "created"
    assert vm_names(attempt.namespace) == sorted([attempt.vm_name, second.vm_name])


def test_stop_delivered_twice_grades_once_and_deletes_once(cluster, lab):
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    tasks.provision_attempt(attempt.id)
    drive_to(attempt, AttemptState.RUNNING)

    pressed = at_once(
        lambda: attempt_stop(actor=student, attempt=attempt), lambda: attempt_stop(actor=student, attempt=attempt)
    )
    assert [getattr(r, "state", r) for r in pressed] == [AttemptState.STOPPING] * 2, pressed
    outcomes = at_once(lambda: tasks.teardown_attempt(attempt.id), lambda: tasks.teardown_attempt(attempt.id))
    # The second delivery finds the first grading the VM and leaves the deletion to it (or, had it come late,
    # finds the VM deleted already).
    assert sorted(map(str, outcomes)) in (["deleted", "grading_elsewhere"], ["deleted", "ended"]), outcomes
    assert tasks.teardown_attempt(attempt.id) in ("ended", "skipped")
    drive_to(attempt, AttemptState.STOPPED)
    assert GradingRun.objects.filter(attempt=attempt).count() == 1
    final = GradingRun.objects.get(attempt=attempt)
    assert final.trigger == "stop" and final.state == RunState.DONE
    assert CheckResult.objects.filter(run=final).count() == 2
    wait_until(lambda: vm_names(attempt.namespace) == [], timeout=20, what="the VM to go")
    # A teardown delivered once more, long after, changes nothing.
    assert tasks.teardown_attempt(attempt.id) == "skipped"
    assert GradingRun.objects.filter(attempt=attempt).count() == 1


def test_check_delivered_twice_runs_the_checks_once(cluster, lab):
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    tasks.provision_attempt(attempt.id)
    drive_to(attempt, AttemptState.RUNNING)

    run = grading_run_request(actor=student, attempt=attempt)
    outcomes = at_once(
        lambda: grading_tasks.grading_run_execute(run.id), lambda: grading_tasks.grading_run_execute(run.id)
    )
    assert sorted(map(str, outcomes)) == ["done", "skipped"], outcomes
    assert grading_tasks.grading_run_execute(run.id) == "skipped"
    assert GradingRun.objects.filter(attempt=attempt).count() == 1
    run.refresh_from_db()
    assert run.state == RunState.DONE
    assert CheckResult.objects.filter(run=run).count() == 2  # one row per check, not two sets
    grade = Grade.objects.get(lab=lab, student=student)
    assert grade.source_run_id == run.id
    # A second press while the first run is queued is refused, not queued twice.
    again = grading_run_request(actor=student, attempt=attempt)
    with pytest.raises(Conflict):
        grading_run_request(actor=student, attempt=attempt)
    assert GradingRun.objects.filter(attempt=attempt, state=RunState.QUEUED).get() == again


def test_a_teardown_retried_after_its_grading_deletes_the_vm(cluster, lab):
    # The first delivery graded, then the API server failed the delete: Celery retries the same task, which must
    # not mistake its own finished grading for another delivery still at work.
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    tasks.provision_attempt(attempt.id)
    drive_to(attempt, AttemptState.RUNNING)
    attempt_stop(actor=student, attempt=attempt)
    cluster.admin.inject_fault(code=500, verbs=["delete"], resources=["virtualmachines"], count=1)
    with pytest.raises(operations.ClusterError):
        stopping.attempt_teardown(attempt_id=attempt.id)
    assert GradingRun.objects.get(attempt=attempt).state == RunState.DONE
    assert vm_names(attempt.namespace) == [attempt.vm_name]
    assert tasks.teardown_attempt(attempt.id) == "deleted"  # the retry
    drive_to(attempt, AttemptState.STOPPED)
    assert GradingRun.objects.filter(attempt=attempt).count() == 1
