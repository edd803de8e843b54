"""``attempt.update`` on the channel layer: sent after commit when the attempt changed, and only then."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers

from labs import tasks
from labs.models import AttemptState
from labs.services import attempt_start, tracking
from labs.tests.conftest import sync_until

pytestmark = pytest.mark.django_db


async def _receive_all(channel: str, *, quiet: float) -> list[dict]:
    layer = channel_layers.make_backend("default")  # a layer's buffers belong to one event loop
    messages = []
    while True:
        try:
            messages.append(await asyncio.wait_for(layer.receive(channel), timeout=quiet))
        except TimeoutError:
            return messages


def test_updates_are_pushed_on_change_and_never_when_nothing_changed(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    channel = f"lifecycle-test-{attempt.id}-{secrets.token_hex(4)}"
    async_to_sync(channel_layers.make_backend("default").group_add)(f"attempt-{attempt.id}", channel)

    with django_capture_on_commit_callbacks(execute=True):
        tasks.provision_attempt(attempt.id)
    with django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.RUNNING)
    messages = async_to_sync(_receive_all)(channel, quiet=0.5)
    assert messages, "no attempt.update was pushed"
    assert all(m["type"] == "attempt.update" and m["attempt"]["id"] == attempt.id for m in messages)
    states = [m["attempt"]["state"] for m in messages]
    # In order, ending running. Whether the held "provisioning" was replaced by "starting" in time depends on how
    # fast the VM was made (the hold itself is tested below, on its own).
    order = ["provisioning", "starting", "running"]
    assert states == sorted(states, key=order.index) and "starting" in states and states[-1] == "running"
    assert messages[-1]["attempt"]["timestamps"]["agent_ready"] is not None

    # Nothing changes on the cluster: the sync lists, finds the same, and says nothing.
    with django_capture_on_commit_callbacks(execute=True):
        report = tracking.namespace_sync(namespace=attempt.namespace)
    assert report.changed == 0
    assert async_to_sync(_receive_all)(channel, quiet=0.5) == []


def test_a_start_pushes_nothing_since_nobody_can_follow_an_attempt_that_did_not_exist(
    student_a, lab_a, monkeypatch, django_capture_on_commit_callbacks
):
    from labs.services import events, start, stopping

    pushed, queued = [], []
    monkeypatch.setattr(events, "send_to_group", lambda group, message, **_how: pushed.append(group))
    monkeypatch.setattr(start, "_provisioning_queued", lambda attempt_id: queued.append(attempt_id) or True)
    monkeypatch.setattr(stopping, "enqueue_teardown", lambda attempt_id: None)
    with django_capture_on_commit_callbacks(execute=True):
        attempt = attempt_start(actor=student_a, lab=lab_a)
    assert queued == [attempt.id] and pushed == []
    # A change after it is pushed as ever.
    with django_capture_on_commit_callbacks(execute=True):
        stopping.attempt_stop(actor=student_a, attempt=attempt)
    assert pushed == [f"attempt-{attempt.id}", f"class-{lab_a.id}"]  # and the lab's class views


# --- held updates ---------------------------------------------------------------------------------------------


class RecordingLayer:
    """A channel layer that notes what it is asked to send, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, dict]] = []
        self.event = threading.Event()

    async def group_send(self, group: str, message: dict) -> None:
        self.sent.append((time.monotonic(), group, message))
        self.event.set()


def sent_until(layer: RecordingLayer, count: int) -> list[tuple[str, str]]:
    """What was sent, as (group, state or type), once ``count`` messages were (however long a loaded host takes)
    and half a second more passed. Held messages go in the order they were held: one its replacement failed to
    cancel would be among the first ``count``."""
    deadline = time.monotonic() + 10
    while len(layer.sent) < count:
        assert time.monotonic() < deadline, f"sent only {layer.sent}"
        time.sleep(0.02)
    time.sleep(0.5)
    return [(group, message.get("attempt", {}).get("state") or message["type"]) for _at, group, message in layer.sent]


def update(state: str) -> dict:
    return {"type": "attempt.update", "attempt": {"id": 1, "state": state}}


def test_a_held_update_replaced_by_a_newer_one_of_its_attempt_is_never_sent():
    from labs.services.events import _Sender

    sender, layer = _Sender(), RecordingLayer()
    sender.submit(layer, "attempt-1", update("provisioning"), hold=0.3)
    sender.submit(layer, "attempt-2", update("provisioning"), hold=0.3)  # another attempt's: its own
    sender.submit(layer, "attempt-1", {"type": "grading.update", "run": {}})  # another kind: replaces nothing
    sender.submit(layer, "attempt-1", update("starting"))
    assert sent_until(layer, 3) == [
        ("attempt-1", "grading.update"),
        ("attempt-1", "starting"),
        ("attempt-2", "provisioning"),
    ]


def test_a_held_update_nothing_replaces_is_sent_once_its_hold_is_over():
    from labs.services.events import _Sender

    sender, layer = _Sender(), RecordingLayer()
    submitted = time.monotonic()
    sender.submit(layer, "attempt-1", update("provisioning"), hold=0.3)
    assert layer.event.wait(3)
    assert layer.sent[0][0] - submitted >= 0.3
    # Held again and replaced by a later held one: only the later goes, its own hold after it was submitted.
    sender.submit(layer, "attempt-1", update("starting"), hold=0.3)
    sender.submit(layer, "attempt-1", update("running"), hold=0.3)
    assert sent_until(layer, 2) == [("attempt-1", "provisioning"), ("attempt-1", "running")]
