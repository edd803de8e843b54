"""The final grading before a VM goes reaches the grading app through a signal: labs does not import grading."""

from __future__ import annotations

import pytest

from labs.models import Attempt
from labs.services.stopping import grade_final
from labs.signals import attempt_final_grading
from labs.tests.test_views import make_attempt


@pytest.fixture
def receivers():
    calls: list[tuple[int, str]] = []

    def record(sender, *, attempt, trigger, **kwargs):
        calls.append((attempt.id, trigger))

    def fail(sender, **kwargs):
        raise RuntimeError("the agent went away")

    attempt_final_grading.connect(record, dispatch_uid="test.record")
    attempt_final_grading.connect(fail, dispatch_uid="test.fail")
    yield calls
    attempt_final_grading.disconnect(dispatch_uid="test.record")
    attempt_final_grading.disconnect(dispatch_uid="test.fail")


def test_grading_listens_for_the_final_grading():
    from grading.apps import grade_before_teardown

    assert attempt_final_grading.disconnect(dispatch_uid="grading.final")  # True: grading's receiver was connected
    attempt_final_grading.connect(grade_before_teardown, dispatch_uid="grading.final")


@pytest.mark.django_db
def test_the_final_grading_is_sent_and_a_failing_receiver_does_not_stop_the_teardown(
    receivers, lab_a, student_a, monkeypatch
):
    monkeypatch.setattr("grading.services.grading_run_final", lambda **kwargs: None)
    attempt = make_attempt(lab=lab_a, student=student_a)
    grade_final(attempt=attempt, trigger="expiry")  # the failing receiver is logged, not raised
    assert receivers == [(attempt.id, "expiry")]
    assert Attempt.objects.filter(id=attempt.id).exists()
