"""Take control: while staff hold the keyboard the student's console is read-only (refused by the bridge, not only
hidden by the page), both sides are told who holds it, and the student gets it back on release, when the staff
member leaves, or when their process dies."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from labs.consumers.console_keyboard import ConsoleKeyboard
from labs.tests import test_consumers as consumer_tests
from labs.tests.test_consumers import connected_student, open_console
from portal.models import AuditEvent

# The console tests' fixtures: a running attempt, and a clean console state and quick password hashing for each test.
attempt = consumer_tests.attempt
isolated_console_state = consumer_tests.isolated_console_state
fast_password_hasher = consumer_tests.fast_password_hasher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def last_hello(viewer) -> dict:
    return [m for m in viewer.messages if m["type"] == "hello"][-1]


async def take_control(student, staff, name: str) -> None:
    await staff.send_json({"type": "take_control"})
    await staff.read_until(lambda v: last_hello(v)["mode"] == "rw")
    await student.read_until(lambda v: last_hello(v)["mode"] == "ro")
    assert last_hello(student)["keyboard"] == name
    assert last_hello(staff)["keyboard"] == name


async def test_while_staff_hold_the_keyboard_the_student_cannot_type_and_both_know_who(
    attempt, cluster, student_a, instructor_a
):
    name = str(instructor_a)
    student = await connected_student(student_a, attempt.id)
    assert last_hello(student)["mode"] == "rw" and last_hello(student)["keyboard"] is None
    staff = await open_console(instructor_a, attempt.id)
    await take_control(student, staff, name)
    await student.read_until(lambda v: "control_taken" in v.notices())

    # The student's keystrokes are refused by the bridge, whatever their page does.
    await student.type(b"echo student-typed-$((3*3))\r")
    await student.read_until(lambda v: "keyboard_held" in v.notices())
    assert next(m for m in student.messages if m.get("code") == "keyboard_held")["who"] == name
    await staff.type(b"echo staff-typed-$((4*4))\r")
    await student.read_until(lambda v: v.has_output(b"staff-typed-16"))
    assert not student.has_output(b"student-typed-9") and not staff.has_output(b"student-typed-9")

    # A tab the student opens meanwhile starts read-only too.
    other_tab = await open_console(student_a, attempt.id)
    assert last_hello(other_tab)["mode"] == "ro" and last_hello(other_tab)["keyboard"] == name
    await other_tab.type(b"echo other-tab-$((5*5))\r")
    await other_tab.read_until(lambda v: "keyboard_held" in v.notices())

    # Released: both student tabs type again.
    await staff.send_json({"type": "release_control"})
    for tab in (student, other_tab):
        await tab.read_until(lambda v: last_hello(v)["mode"] == "rw" and last_hello(v)["keyboard"] is None)
    await staff.read_until(lambda v: last_hello(v)["mode"] == "ro")
    await other_tab.type(b"echo back-$((6*6))\r")
    await student.read_until(lambda v: v.has_output(b"back-36"))
    assert not student.has_output(b"other-tab-25")
    actions = await sync_to_async(list)(AuditEvent.objects.values_list("action", flat=True).order_by("id"))
    assert [a for a in actions if a.startswith("console.")] == ["console.take_control", "console.release_control"]
    for viewer in (other_tab, staff, student):
        await viewer.close()


async def test_the_student_gets_the_keyboard_back_when_staff_leave(attempt, cluster, student_a, instructor_a):
    student = await connected_student(student_a, attempt.id)
    staff = await open_console(instructor_a, attempt.id)
    await take_control(student, staff, str(instructor_a))
    await staff.close()
    await student.read_until(lambda v: last_hello(v)["mode"] == "rw")
    await student.read_until(lambda v: "control_released" in v.notices())
    await student.type(b"echo mine-again-$((7*7))\r")
    await student.read_until(lambda v: v.has_output(b"mine-again-49"))
    assert await sync_to_async(AuditEvent.objects.filter(action="console.release_control").count)() == 1
    await student.close()


async def test_the_keyboard_comes_back_when_the_staff_members_process_dies(
    attempt, cluster, student_a, instructor_a, settings, monkeypatch
):
    settings.CONSOLE_LEASE_TTL_SECONDS = 1.5

    beat = ConsoleKeyboard._beat_control

    async def dead_if_holding(self):  # the staff member's process died: it renews nothing and says nothing
        if not self.control_mine:
            await beat(self)

    monkeypatch.setattr(ConsoleKeyboard, "_beat_control", dead_if_holding)
    student = await connected_student(student_a, attempt.id)
    staff = await open_console(instructor_a, attempt.id)
    await take_control(student, staff, str(instructor_a))
    if not settings.REDIS_URL:  # this process's memory has no expiry: end it as Redis would
        from labs.console.state import LocalConsoleState

        await LocalConsoleState().delete("control", attempt.id)
    await student.read_until(lambda v: last_hello(v)["mode"] == "rw", within=5)
    assert last_hello(student)["keyboard"] is None
    await staff.close()
    await student.close()


async def test_a_watcher_who_has_not_taken_control_leaves_the_student_typing(attempt, cluster, student_a, ta_a):
    student = await connected_student(student_a, attempt.id)
    watcher = await open_console(ta_a, attempt.id)
    await watcher.close()
    await student.drain(0.5)
    assert last_hello(student)["mode"] == "rw"
    await student.type(b"echo still-$((8*8))\r")
    await student.read_until(lambda v: v.has_output(b"still-64"))
    await student.close()
