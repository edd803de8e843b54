"""``attempt.update`` on the channel layer: sent after commit when the attempt changed, and only then."""

from __future__ import annotations

import asyncio
import secrets

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
        lifecycle, student_a, lab_a, django_capture_on_commit_callbacks):
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
    assert states[0] == "provisioning" and states[-1] == "running"
    assert "starting" in states
    assert messages[-1]["attempt"]["timestamps"]["agent_ready"] is not None

    # Nothing changes on the cluster: the sync lists, finds the same, and says nothing.
    with django_capture_on_commit_callbacks(execute=True):
        report = tracking.namespace_sync(namespace=attempt.namespace)
    assert report.changed == 0
    assert async_to_sync(_receive_all)(channel, quiet=0.5) == []


def test_a_start_pushes_nothing_since_nobody_can_follow_an_attempt_that_did_not_exist(
        student_a, lab_a, monkeypatch, django_capture_on_commit_callbacks):
    from labs.services import attempts, events

    pushed, queued = [], []
    monkeypatch.setattr(events, "send_to_group", lambda group, message: pushed.append(group))
    monkeypatch.setattr(attempts, "_enqueue_provision", lambda attempt_id: queued.append(attempt_id) or {})
    monkeypatch.setattr(attempts, "enqueue_teardown", lambda attempt_id: None)
    with django_capture_on_commit_callbacks(execute=True):
        attempt = attempt_start(actor=student_a, lab=lab_a)
    assert queued == [attempt.id] and pushed == []
    # A change after it is pushed as ever.
    with django_capture_on_commit_callbacks(execute=True):
        attempts.attempt_stop(actor=student_a, attempt=attempt)
    assert pushed == [f"attempt-{attempt.id}"]
