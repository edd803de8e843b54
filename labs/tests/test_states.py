"""The attempt's state machine: one table, one function that moves an attempt, and no other code writing
``Attempt.state``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from grading.tests.builders import make_attempt
from labs import states
from labs.models import Attempt, AttemptState
from labs.services import events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pushed(monkeypatch) -> list[tuple[int, str]]:
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(
        events,
        "attempt_push_on_commit",
        lambda *, attempt, hold=0.0: transaction.on_commit(lambda: sent.append((attempt.id, attempt.state))),
    )
    return sent


def test_a_transition_moves_a_waiting_attempt_stamps_it_and_pushes_on_commit(lab_a, student_a, pushed):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STARTING)
    with transaction.atomic():
        moved = states.attempt_transition(attempt=attempt.id, to=AttemptState.STOPPING, stop_reason="student")
        assert pushed == []  # not before the commit
    assert moved.state == AttemptState.STOPPING and moved.stopping_at is not None
    assert pushed == [(attempt.id, AttemptState.STOPPING)]
    stored = Attempt.objects.get(id=attempt.id)
    assert (stored.state, stored.stop_reason, stored.stopping_at) == (
        AttemptState.STOPPING,
        "student",
        moved.stopping_at,
    )


def test_an_attempt_that_moved_on_is_left_alone(lab_a, student_a, pushed):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    assert (
        states.attempt_transition(attempt=attempt, to=AttemptState.RUNNING, from_states=(AttemptState.STARTING,))
        is None
    )
    assert Attempt.objects.get(id=attempt.id).state == AttemptState.STOPPED
    assert pushed == []


def test_a_transition_the_table_does_not_allow_is_refused(lab_a, student_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    with pytest.raises(states.IllegalTransition):
        states.attempt_transition(attempt=attempt, to=AttemptState.RUNNING, from_states=(AttemptState.STOPPED,))
    with pytest.raises(states.IllegalTransition):
        states.attempt_transition(attempt=attempt, to=AttemptState.REQUESTED)


def state_writes(path: Path) -> list[str]:
    """Lines of ``path`` that set an attempt's state: ``state=AttemptState.X`` passed to anything but a filter, an
    assignment to ``.state``, a ``"state": AttemptState.X`` entry, or ``"state"`` in an attempt's ``update_fields``."""
    readers = {"filter", "exclude", "Q", "get", "first", "When", "Count"}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            for keyword in node.keywords:
                if keyword.arg == "state" and "AttemptState" in ast.unparse(keyword.value) and name not in readers:
                    found.append(node.lineno)
                saved = ast.unparse(getattr(node.func, "value", node.func))
                if (
                    keyword.arg == "update_fields"
                    and "'state'" in ast.unparse(keyword.value)
                    and ("attempt" in saved or saved == "locked")
                ):  # a grading run's own state is not one
                    found.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and part.attr == "state"
                        and "AttemptState" in ast.unparse(node.value)
                    ):
                        found.append(node.lineno)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "state" and "AttemptState" in ast.unparse(value):
                    found.append(node.lineno)
    return [f"{path.name}:{line}" for line in sorted(set(found))]


def test_no_product_code_but_labs_states_writes_an_attempts_state():
    base = Path(settings.BASE_DIR)
    offenders = []
    for app in ("portal", "labs", "grading", "api"):
        for path in sorted((base / app).rglob("*.py")):
            if "tests" in path.parts or "migrations" in path.parts or path == base / "labs" / "states.py":
                continue
            offenders += state_writes(path)
    assert offenders == []


def test_the_scan_sees_each_way_of_writing_a_state(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "Attempt.objects.filter(id=1, state=AttemptState.RUNNING).update(state=AttemptState.STOPPED)\n"
        "attempt.state = AttemptState.STOPPING\n"
        "attempt.save(update_fields=['state'])\n"
        "changes = {'state': AttemptState.FAILED}\n",
        encoding="utf-8",
    )
    assert state_writes(module) == ["m.py:1", "m.py:2", "m.py:3", "m.py:4"]
