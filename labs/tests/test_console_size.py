"""The guest console's size: set through the lab agent without typing, typed only as the student's fallback, and
remembered so that a replay is drawn at the width it was written at."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async

from labs.console import access as console_access
from labs.tests import test_consumers as consumer_tests
from labs.tests.test_consumers import connected_student, open_console

# The console tests' fixtures: a running attempt, and a clean console state and quick password hashing for each test.
attempt = consumer_tests.attempt
isolated_console_state = consumer_tests.isolated_console_state
fast_password_hasher = consumer_tests.fast_password_hasher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def resized(viewer) -> list[dict]:
    return [m for m in viewer.messages if m["type"] == "resized"]


async def stty_size(viewer, marker: str) -> tuple[int, int]:
    """What the guest's shell reads as its terminal size (``stty size``), asked with an echo-proof marker."""
    await viewer.type(f"stty size; echo {marker}-$((2*3))\r".encode())
    await viewer.read_until(lambda v: f"{marker}-6".encode() in v.output)
    found = re.findall(rb"(\d+) (\d+)\r\n" + marker.encode() + rb"-6", bytes(viewer.output))
    rows, cols = found[-1]
    return int(rows), int(cols)


async def test_a_resize_reaches_the_guest_through_its_agent_without_typing(attempt, cluster, student_a):
    student = await connected_student(student_a, attempt.id)
    before = len(student.output)
    await student.send_json({"type": "resize", "rows": 37, "cols": 131, "explicit": True})
    await student.read_until(lambda v: resized(v))
    assert resized(student)[-1] == {"type": "resized", "via": "agent", "rows": 37, "cols": 131, "command": ""}
    await student.drain(0.3)
    assert b"stty" not in bytes(student.output[before:]), "nothing was typed into the shell"
    assert await stty_size(student, "size-a") == (37, 131)
    # A tab that opens later is told the size its scrollback was written at.
    other = await open_console(student_a, attempt.id)
    hello = next(m for m in other.messages if m["type"] == "hello")
    assert (hello["cols"], hello["rows"]) == (131, 37)
    await other.close()
    await student.close()


async def test_resizes_in_quick_succession_set_only_the_last(attempt, cluster, student_a, monkeypatch):
    calls = []
    resize = console_access.console_resize

    def counted(**kwargs):
        calls.append((kwargs["rows"], kwargs["cols"]))
        return resize(**kwargs)

    monkeypatch.setattr(
        "labs.consumers.console_keyboard._console_resize", sync_to_async(counted, thread_sensitive=False)
    )
    student = await connected_student(student_a, attempt.id)
    for cols in range(90, 100):
        await student.send_json({"type": "resize", "rows": 30, "cols": cols})
    await student.read_until(lambda v: resized(v))
    await student.drain(0.5)
    assert calls == [(30, 99)]
    await student.close()


async def test_without_an_agent_fit_types_stty_and_a_window_resize_types_nothing(
    attempt, cluster, student_a, monkeypatch
):
    def agent_down(attempt, *, rows, cols, timeout_s=3.0):
        from labs.agent_client import AgentNotAnswering

        raise AgentNotAnswering("nothing listens")

    monkeypatch.setattr("labs.agent_client.set_tty_size", agent_down)
    student = await connected_student(student_a, attempt.id)
    await student.send_json({"type": "resize", "rows": 33, "cols": 101})
    await student.read_until(lambda v: resized(v))
    assert resized(student)[-1]["via"] == "none"
    await student.drain(0.3)
    assert b"stty rows" not in student.output
    # The student clicked Fit: typed, with a leading space (out of the shell's history).
    await student.send_json({"type": "resize", "rows": 33, "cols": 101, "explicit": True})
    await student.read_until(lambda v: len(resized(v)) == 2)
    assert resized(student)[-1]["via"] == "typed"
    assert resized(student)[-1]["command"] == " stty rows 33 cols 101"
    await student.read_until(lambda v: v.has_output(b"stty rows 33 cols 101"))
    assert await stty_size(student, "size-b") == (33, 101)
    await student.close()


@pytest.mark.parametrize(
    "message",
    [{"rows": 0, "cols": 80}, {"rows": 24, "cols": "80"}, {"rows": 24}, {"rows": True, "cols": 80}],
    ids=["zero", "string", "missing", "bool"],
)
async def test_a_bad_size_is_refused(attempt, cluster, student_a, message):
    student = await connected_student(student_a, attempt.id)
    await student.send_json({"type": "resize", **message})
    await student.read_until(lambda v: "bad_message" in v.notices())
    await student.drain(0.4)
    assert not resized(student)
    await student.close()


async def test_a_watcher_does_not_resize_the_students_console(attempt, cluster, student_a, ta_a, monkeypatch):
    calls = []
    monkeypatch.setattr(
        "labs.consumers.console_keyboard._console_resize",
        sync_to_async(lambda **kwargs: calls.append(kwargs) or True, thread_sensitive=False),
    )
    student = await connected_student(student_a, attempt.id)
    watcher = await open_console(ta_a, attempt.id)
    await watcher.send_json({"type": "resize", "rows": 50, "cols": 200, "explicit": True})
    await watcher.drain(0.6)
    assert not calls and not resized(watcher)
    await watcher.close()
    await student.close()
