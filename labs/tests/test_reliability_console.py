"""The console bridge under faults, through the real ASGI stack, the Redis channel layer and kubesim: the upstream
cut again and again, the API server refusing the console, the VM stopped under a connected student, and a browser
that stops reading while the guest floods output. Each time the student reads a clear status, the bridge retries
at a bounded pace, memory stays bounded, and typing works again once the fault is gone."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from labs import tasks
from labs.console.state import console_state
from labs.models import Attempt, AttemptState
from labs.services import attempt_start, attempt_stop
from labs.tests.reliability import (
    cluster_fixture,
    drive_to,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
)
from ops.asgi import application

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")
CONSOLE = "virtualmachineinstances/console"


kubesim = kubesim_fixture("console")
cluster = cluster_fixture(CONSOLE_RECORDINGS_DIR=lambda tmp_path: tmp_path / "recordings")


@pytest.fixture
def attempt(cluster) -> Attempt:
    lab = make_lab(make_course(make_tenant("Console Reliability")))
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    assert tasks.provision_attempt(attempt.id) == "created"
    drive_to(attempt, AttemptState.RUNNING)
    return Attempt.objects.select_related("student", "lab").get(pk=attempt.pk)  # no lazy loads in async code


class Viewer:
    """One browser tab on the console socket, collecting terminal bytes and control messages."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.communicator = communicator
        self.output = bytearray()
        self.messages: list[dict] = []
        self.closed_with: int | None = None
        # A browser acknowledges what xterm.js has drawn; a slow one stops doing so.
        self.acking = True

    async def _take(self, seconds: float) -> bool:
        if self.communicator.future.done() and self.communicator.output_queue.empty():
            self.communicator.future.result()
            self.closed_with = self.closed_with or -1
            return False
        try:
            frame = await asyncio.wait_for(self.communicator.output_queue.get(), seconds)
        except TimeoutError:
            return False
        if frame["type"] == "websocket.close":
            self.closed_with = frame.get("code")
            return False
        if frame.get("bytes") is not None:
            self.output += frame["bytes"]
            if self.acking:
                await self.communicator.send_to(text_data=json.dumps({"type": "ack", "bytes": len(self.output)}))
        else:
            self.messages.append(json.loads(frame["text"]))
        return True

    async def read_until(self, predicate, *, within: float = 15.0, what: str = "") -> None:
        deadline = time.monotonic() + within
        while not predicate(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out {what}; output={bytes(self.output[-300:])!r} messages={self.messages[-8:]}"
            if not await self._take(min(left, 0.5)) and self.closed_with is not None:
                if predicate(self):
                    return
                raise AssertionError(f"socket closed with {self.closed_with}; messages={self.messages[-8:]}")

    async def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self._take(max(0.01, deadline - time.monotonic()))

    def statuses(self) -> list[str]:
        return [m["state"] for m in self.messages if m["type"] == "status"]

    def last_status(self) -> dict:
        return [m for m in self.messages if m["type"] == "status"][-1]

    async def type(self, data: bytes) -> None:
        await self.communicator.send_to(bytes_data=data)

    async def close(self) -> None:
        await self.communicator.disconnect()


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def connected(attempt: Attempt) -> Viewer:
    cookie = await sync_to_async(cookie_for)(attempt.student)
    viewer = Viewer(
        WebsocketCommunicator(
            application, f"/ws/attempts/{attempt.id}/console/", headers=[ORIGIN, HOST, (b"cookie", cookie)]
        )
    )
    accepted, code = await viewer.communicator.connect(timeout=10)
    assert accepted, code
    await viewer.read_until(lambda v: "connected" in v.statuses(), what="to connect")
    return viewer


async def echoes(viewer: Viewer, word: str) -> None:
    """Typing reaches the guest's shell and its echo comes back: the console works."""
    await viewer.type(f"echo {word}-$((40+2))\r".encode())
    await viewer.read_until(lambda v: f"{word}-42".encode() in v.output, what=f"the echo of {word}")


async def console_requests(cluster) -> int:
    counters = await sync_to_async(cluster.admin.counters)()
    return counters["by_resource"].get(CONSOLE, 0)


async def test_an_upstream_cut_again_and_again_is_reported_and_recovers(cluster, attempt):
    viewer = await connected(attempt)
    await echoes(viewer, "before")
    await sync_to_async(cluster.admin.inject_fault)(console_drop_after=0.7)
    await sync_to_async(cluster.admin.disconnect_consoles)(namespace=attempt.namespace, name=attempt.vm_name)
    before = await console_requests(cluster)
    started = time.monotonic()
    # Every cut is told to the browser (a loaded host only spaces them out) ...
    await viewer.read_until(lambda v: v.statuses().count("lost") >= 3, within=30, what="three cuts told")
    window = time.monotonic() - started
    dialled = await console_requests(cluster) - before
    # ... and each reconnect follows a working connection of 0.7 s, never a tight loop.
    assert 2 <= dialled <= window / 0.7 + 2, (dialled, window)

    await sync_to_async(cluster.admin.clear_faults)()
    await viewer.read_until(lambda v: v.statuses()[-1] == "connected", within=10, what="to reconnect")
    await echoes(viewer, "after")
    await viewer.close()


async def test_a_console_the_api_server_refuses_backs_off_to_its_cap_then_recovers(cluster, attempt):
    viewer = await connected(attempt)
    await sync_to_async(cluster.admin.inject_fault)(code=500, resources=[CONSOLE])
    before = await console_requests(cluster)
    await sync_to_async(cluster.admin.disconnect_consoles)(namespace=attempt.namespace, name=attempt.vm_name)
    window = 9.0
    await viewer.drain(window)
    dialled = await console_requests(cluster) - before
    # Backing off 1, 2, 4, then 5 s (the cap): about four tries in nine seconds, and the reason is shown.
    assert 2 <= dialled <= 6, dialled
    assert viewer.last_status()["state"] == "lost"  # the page says it is reconnecting

    await sync_to_async(cluster.admin.clear_faults)()
    await viewer.read_until(lambda v: v.statuses()[-1] == "connected", within=8, what="to reconnect after the cap")
    await echoes(viewer, "back")
    await viewer.close()


async def test_stopping_the_vm_under_a_connected_student_ends_the_console_in_words(cluster, attempt):
    viewer = await connected(attempt)
    await echoes(viewer, "working")
    await sync_to_async(attempt_stop)(actor=attempt.student, attempt=attempt)
    await sync_to_async(tasks.teardown_attempt)(attempt.id)
    await sync_to_async(drive_to)(attempt, AttemptState.STOPPED)
    await viewer.read_until(lambda v: "ended" in v.statuses(), within=15, what="the console to end")
    # Once ended, the bridge does not keep dialling a VM that is gone.
    settled = await console_requests(cluster)
    await viewer.drain(3.0)
    assert await console_requests(cluster) == settled
    assert viewer.statuses()[-1] == "ended"
    # Typing into it is answered in words, not silently swallowed.
    await viewer.type(b"ls\r")
    await viewer.read_until(
        lambda v: any(m["type"] == "notice" and m["code"] == "not_connected" for m in v.messages),
        within=5,
        what="the not-connected notice",
    )
    await viewer.close()


async def test_a_browser_that_stops_reading_costs_bounded_memory_and_catches_up(cluster, attempt, settings):
    window = 64 * 1024
    settings.CONSOLE_OUTPUT_WINDOW_BYTES = window
    viewer = await connected(attempt)
    guest = await sync_to_async(cluster.admin.guest)(attempt.namespace, attempt.vm_name)
    marker = Path(guest["home"]) / "flood-done"
    flood = 40 * 1024 * 1024
    viewer.acking = False
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    # 40 MiB of output; the browser acknowledges nothing while it scrolls past.
    await viewer.type(
        f"head -c {flood} /dev/zero | tr '\\0' x; touch ~/{marker.name}; echo; echo flood-$((6*7))\r".encode()
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the guest's output stalled: the bridge stopped reading"
        await viewer.drain(0.2)
    await viewer.drain(1.0)
    rss_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    # The whole flood went through the bridge (the guest finished writing it: nothing blocked), yet this browser
    # was sent about one window, this process grew by a fraction of the flood, and the scrollback kept its size.
    assert any(m["type"] == "lagging" for m in viewer.messages)
    assert len(viewer.output) <= 2 * window + 8 * 1024, len(viewer.output)
    assert rss_growth_mib < 16, rss_growth_mib
    snapshot = await console_state().scrollback_snapshot(attempt_id=attempt.id)
    assert len(snapshot.data) <= settings.CONSOLE_SCROLLBACK_BYTES and snapshot.end >= flood

    # The browser catches up: a fresh screen from the scrollback, then live output and typing again.
    viewer.acking = True
    await viewer.communicator.send_to(text_data=json.dumps({"type": "ack", "bytes": len(viewer.output)}))
    await viewer.read_until(lambda v: any(m["type"] == "reset" for m in v.messages), what="the redraw")
    await viewer.read_until(lambda v: b"flood-42" in v.output, what="the end of the flood after the redraw")
    await echoes(viewer, "caught-up")
    await viewer.close()


async def test_a_browser_that_never_catches_up_is_closed_with_a_reason(cluster, attempt, settings):
    settings.CONSOLE_OUTPUT_WINDOW_BYTES = 16 * 1024
    settings.CONSOLE_LAG_CLOSE_SECONDS = 1.5
    viewer = await connected(attempt)
    viewer.acking = False
    await viewer.type(b"seq 1 200000\r")
    await viewer.read_until(lambda v: v.closed_with is not None, within=20, what="the lagging viewer to be closed")
    assert viewer.closed_with == 4008
    assert any(m["type"] == "notice" and m["code"] == "too_slow" for m in viewer.messages)
    # A new tab is served normally: the slow one took nothing with it.
    fresh = await connected(attempt)
    await echoes(fresh, "fresh")
    await fresh.close()
