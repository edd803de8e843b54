"""End to end on kubesim: a student checks, fails, fixes the guest through the serial console, checks again and
passes; the score and the grade are stored. Everything goes through the cluster API (portforward, console)."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.urls import reverse

from grading.models import Grade, GradingRun, RunState, RunTrigger
from grading.services import grading_regrade, grading_run_final, grading_run_request
from grading.tests.guests import type_on_console

pytestmark = pytest.mark.django_db


def check(*, attempt, actor, callbacks_fixture) -> GradingRun:
    """Press Check; the task is sent on commit and, with eager Celery, runs the real task body at once."""
    with callbacks_fixture(execute=True):
        run = grading_run_request(actor=actor, attempt=attempt)
    run.refresh_from_db()
    return run


def wait_for_file(path: Path, *, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def test_fail_fix_through_the_console_then_pass(
    cluster, running_attempt, student_a, lab_a, settings, eager_celery, django_capture_on_commit_callbacks, client
):
    settings.GRADING_MIN_INTERVAL_SECONDS = 0

    first = check(attempt=running_attempt, actor=student_a, callbacks_fixture=django_capture_on_commit_callbacks)
    assert first.state == RunState.DONE, first.error
    assert (first.score, first.max_score) == (Decimal("0.00"), Decimal("3.00"))
    results = list(first.results.order_by("order"))
    assert [r.passed for r in results] == [False, False]
    assert results[0].feedback == "Create the file in your home directory."
    assert "No such file" in results[1].stderr
    assert Grade.objects.get(lab=lab_a, student=student_a).score == Decimal("0.00")

    # The student fixes the guest by typing into the serial console.
    type_on_console(running_attempt, "echo 'hello world' > ~/hello.txt\n")
    guest = cluster.admin.guest(running_attempt.namespace, running_attempt.vm_name)
    assert wait_for_file(Path(guest["home"]) / "hello.txt") == "hello world\n"

    second = check(attempt=running_attempt, actor=student_a, callbacks_fixture=django_capture_on_commit_callbacks)
    assert second.state == RunState.DONE, second.error
    assert (second.score, second.max_score) == (Decimal("3.00"), Decimal("3.00"))
    assert [r.passed for r in second.results.order_by("order")] == [True, True]
    assert second.results.get(order=2).stdout == "hello world\n"
    grade = Grade.objects.get(lab=lab_a, student=student_a)
    assert (grade.score, grade.final_score, grade.source_run_id) == (Decimal("3.00"), Decimal("3.00"), second.pk)

    # The student sees both runs with their feedback.
    client.force_login(student_a)
    page = client.get(reverse("grading:my_lab", args=[lab_a.pk])).content.decode()
    assert f'id="run-{first.pk}"' in page
    assert f'id="run-{second.pk}"' in page
    assert "Create the file in your home directory." in page


def test_final_run_at_expiry_and_regrade_reruns_in_the_guest(
    cluster, running_attempt, student_a, instructor_a, lab_a, settings, eager_celery, django_capture_on_commit_callbacks
):
    guest = cluster.admin.guest(running_attempt.namespace, running_attempt.vm_name)
    (Path(guest["home"]) / "hello.txt").write_text("Hello World\n")  # right words, wrong capitals

    final = grading_run_final(attempt=running_attempt, trigger=RunTrigger.EXPIRY)
    assert final.state == RunState.DONE, final.error
    assert final.trigger == RunTrigger.EXPIRY
    assert final.score == Decimal("1.00")

    # The instructor decides capitals do not matter and regrades; the VM still runs, so the guest is checked
    # again too.
    second_check = lab_a.checks.get(order=2)
    second_check.stdout_match = "regex"
    second_check.stdout_pattern = r"(?i)hello world"
    second_check.save()
    with django_capture_on_commit_callbacks(execute=True):
        outcome = grading_regrade(actor=instructor_a, attempt=running_attempt)
    [reevaluated] = outcome.reevaluated
    assert reevaluated.regrade_of_id == final.pk
    assert reevaluated.score == Decimal("3.00")
    outcome.queued.refresh_from_db()
    assert outcome.queued.state == RunState.DONE, outcome.queued.error
    assert outcome.queued.trigger == RunTrigger.REGRADE
    assert outcome.queued.score == Decimal("3.00")
    assert Grade.objects.get(lab=lab_a, student=student_a).score == Decimal("3.00")


def test_check_after_the_vm_is_gone_records_an_error(
    cluster, running_attempt, student_a, lab_a, eager_celery, django_capture_on_commit_callbacks
):
    from labs.kubevirt import operations

    operations.vm_delete(namespace=running_attempt.namespace, name=running_attempt.vm_name)
    deadline = time.monotonic() + 10
    while cluster.admin.guest(running_attempt.namespace, running_attempt.vm_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    run = check(attempt=running_attempt, actor=student_a, callbacks_fixture=django_capture_on_commit_callbacks)
    assert run.state == RunState.ERROR
    assert run.error_code in {"vm_not_running", "agent_not_answering"}
    assert run.score is None
    assert not Grade.objects.filter(lab=lab_a, student=student_a, score__isnull=False).exists()
