"""The attempt events socket and the console bridge through the real ASGI stack against kubesim: a refused viewer
causes no console request (kubesim's counters), and several communicators on one attempt share one upstream, every
tab sees the output, staff are read-only."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext

from conftest import make_person
from labs.console.recording import recording_path
from labs.console.state import console_state
from labs.consumers import console as console_consumer
from labs.models import Attempt, AttemptState
from labs.services import attempt_extend
from labs.sync_health import record_sync_success
from ops.asgi import application
from portal.models import AuditEvent, Role
from tests.browser.attempts import running_attempt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")  # what a browser sends with the Origin it is compared with
CONSOLE_RESOURCE = "virtualmachineinstances/console"


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def isolated_console_state(settings, tmp_path):
    """Fresh recordings directory and channel layer, and no lease or scrollback left in Redis by an earlier run's
    attempt ids."""
    settings.CONSOLE_RECORDINGS_DIR = tmp_path / "recordings"
    # A channel layer of its own (setting it makes channels build a new one): channels_redis keeps its receive state
    # per layer, bound to the event loop that started receiving, and each test runs a loop of its own.
    settings.CHANNEL_LAYERS = settings.CHANNEL_LAYERS
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        keys = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}portal:console:*"))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def attempt(cluster, student_a, lab_a):
    return running_attempt(student=student_a, lab=lab_a)


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


class Viewer:
    """One browser tab on a socket: collects terminal bytes and control messages as they arrive."""

    def __init__(self, path: str, headers: list[tuple[bytes, bytes]], *, app=application) -> None:
        self.communicator = WebsocketCommunicator(app, path, headers=headers)
        self.output = bytearray()
        self.messages: list[dict] = []
        self.closed_with: int | None = None
        self.received = 0
        self.acknowledges = False
        self.screen_starts = 0

    async def connect(self) -> tuple[bool, int | None]:
        return await self.communicator.connect(timeout=10)

    async def _take(self, seconds: float) -> bool:
        # Not receive_output(): on a timeout it cancels the application, and a quiet console is no error.
        if self.communicator.future.done() and self.communicator.output_queue.empty():
            self.communicator.future.result()  # raises what the consumer died of
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
            self.received += len(frame["bytes"])
            if self.acknowledges:  # a browser that draws at once
                await self.send_json({"type": "ack", "bytes": self.received})
        else:
            message = json.loads(frame["text"])
            self.messages.append(message)
            if message["type"] in ("hello", "reset"):
                # A page clears its terminal here: what it shows is what arrives after.
                self.screen_starts = len(self.output)
        return True

    async def read_until(self, predicate, *, within: float = 15.0) -> None:
        deadline = time.monotonic() + within
        while not predicate(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; output={bytes(self.output[-500:])!r} messages={self.messages[-10:]}"
            if not await self._take(min(left, 0.5)) and self.closed_with is not None:
                raise AssertionError(f"socket closed with {self.closed_with}; messages={self.messages}")

    async def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self._take(max(0.01, deadline - time.monotonic()))

    @property
    def screen(self) -> bytes:
        return bytes(self.output[self.screen_starts :])

    def has_output(self, needle: bytes) -> bool:
        return needle in self.output

    def statuses(self) -> list[str]:
        return [m["state"] for m in self.messages if m["type"] == "status"]

    def notices(self) -> list[str]:
        return [m["code"] for m in self.messages if m["type"] == "notice"]

    async def type(self, data: bytes) -> None:
        await self.communicator.send_to(bytes_data=data)

    async def send_json(self, payload: dict) -> None:
        await self.communicator.send_to(text_data=json.dumps(payload))

    async def close(self) -> None:
        await self.communicator.disconnect()


async def open_console(
    user, attempt_id: int, *, origin: tuple[bytes, bytes] | None = ORIGIN, app=application
) -> Viewer:
    headers = [HOST, origin] if origin else [HOST]
    if user is not None:
        headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
    viewer = Viewer(f"/ws/attempts/{attempt_id}/console/", headers, app=app)
    connected, code = await viewer.connect()
    assert connected, f"refused with {code}"
    await viewer.read_until(lambda v: any(m["type"] == "hello" for m in v.messages))
    return viewer


def console_requests(cluster) -> int:
    return cluster.admin.counters()["by_resource"].get(CONSOLE_RESOURCE, 0)


def open_consoles(cluster) -> int:
    return cluster.admin.counters()["open_consoles"]


async def wait_for(condition, *, within: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not await sync_to_async(condition)():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def open_events(user, attempt_id: int, *, app=application) -> Viewer:
    """The attempt's events socket, open, with its first message (the current status) read."""
    viewer = Viewer(
        f"/ws/attempts/{attempt_id}/events/",
        [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(user))],
        app=app,
    )
    assert (await viewer.connect())[0]
    await viewer.read_until(lambda v: len(v.messages) >= 1)
    return viewer


async def connected_student(user, attempt_id: int, *, app=application) -> Viewer:
    viewer = await open_console(user, attempt_id, app=app)
    await viewer.read_until(lambda v: "connected" in v.statuses())
    return viewer


# -- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "who", ["anonymous", "classmate", "other_tenant_student", "other_tenant_instructor", "bad_origin", "missing_origin"]
)
async def test_refused_before_kubesim_sees_a_console_request(
    who, attempt, cluster, student_a, student_b, instructor_b, tenant_a, course_a
):
    classmate = await sync_to_async(make_person)(
        username="classmate_a", tenant=tenant_a, course=course_a, role=Role.STUDENT
    )
    user, origin = {
        "anonymous": (None, ORIGIN),
        "classmate": (classmate, ORIGIN),
        "other_tenant_student": (student_b, ORIGIN),
        "other_tenant_instructor": (instructor_b, ORIGIN),
        "bad_origin": (student_a, (b"origin", b"http://evil.example")),
        "missing_origin": (student_a, None),
    }[who]
    before = await sync_to_async(console_requests)(cluster)
    for path in (f"/ws/attempts/{attempt.id}/console/", f"/ws/attempts/{attempt.id}/events/"):
        headers = [HOST, origin] if origin else [HOST]
        if user is not None:
            headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        assert not connected, path
        await communicator.disconnect()
    await asyncio.sleep(1.0)  # long enough for a wrongly started upstream to have dialled
    assert await sync_to_async(console_requests)(cluster) == before


async def test_refused_for_an_unknown_attempt(cluster, student_a):
    communicator = WebsocketCommunicator(
        application,
        "/ws/attempts/999999/console/",
        headers=[ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(student_a))],
    )
    connected, code = await communicator.connect(timeout=10)
    assert not connected and code == 4404


# -- sharing ----------------------------------------------------------------------------------------------------


async def test_student_types_and_sees_the_echo_and_a_ta_watches_read_only(attempt, cluster, student_a, ta_a):
    student = await connected_student(student_a, attempt.id)
    assert student.messages[0] == {
        "type": "hello",
        "attempt": attempt.id,
        "mode": "rw",
        "can_take_control": False,
        "keyboard": None,
        "replay": 0,
        "cols": 80,
        "rows": 24,
    }
    ta = await open_console(ta_a, attempt.id)
    assert ta.messages[0]["mode"] == "ro" and ta.messages[0]["can_take_control"] is True

    await student.type(b"echo from-student-$((6*7))\r")
    await student.read_until(lambda v: v.has_output(b"from-student-42"))
    await ta.read_until(lambda v: v.has_output(b"from-student-42"))

    await ta.type(b"echo ta-was-here-$((1+1))\r")
    await ta.read_until(lambda v: "read_only" in v.notices())
    await student.type(b"echo after-ta-$((2+3))\r")
    await student.read_until(lambda v: v.has_output(b"after-ta-5"))
    await ta.read_until(lambda v: v.has_output(b"after-ta-5"))
    assert b"ta-was-here" not in student.output and b"ta-was-here" not in ta.output
    assert "staff_watching" in student.notices()
    assert "staff_watching" not in ta.notices(), "the watcher is not told of itself"
    await ta.close()
    await student.close()


async def test_signing_out_closes_that_sessions_sockets_and_no_others(attempt, cluster, student_a):
    browser = Client()  # a shared computer's browser; the same student is signed in elsewhere too
    await sync_to_async(browser.force_login)(student_a)
    cookie = (
        b"cookie",
        f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode(),
    )
    console = Viewer(f"/ws/attempts/{attempt.id}/console/", [HOST, ORIGIN, cookie])
    events = Viewer(f"/ws/attempts/{attempt.id}/events/", [HOST, ORIGIN, cookie])
    assert (await console.connect())[0] and (await events.connect())[0]
    await console.read_until(lambda v: "connected" in v.statuses())
    elsewhere = await connected_student(student_a, attempt.id)

    await sync_to_async(browser.post)(reverse("logout"))
    for viewer in (console, events):
        await viewer.drain(3)
        assert viewer.closed_with == 4401
    await console.communicator.send_to(bytes_data=b"echo after-sign-out-$((3*3))\r")
    await elsewhere.type(b"echo still-signed-in-$((4*4))\r")
    await elsewhere.read_until(lambda v: v.has_output(b"still-signed-in-16"))
    assert not elsewhere.has_output(b"after-sign-out-9")
    await elsewhere.close()


async def test_a_viewer_announces_itself_only_when_somebody_else_watches(attempt, cluster, student_a, monkeypatch):
    announced: list[tuple[str, str]] = []
    layer_class = type(get_channel_layer())
    send, group_send = layer_class.send, layer_class.group_send

    async def recording_send(self, channel, message):
        if message.get("type") == "console.viewer_joined":
            announced.append((channel, message["reply_to"]))
        return await send(self, channel, message)

    async def recording_group_send(self, group, message):
        assert message.get("type") != "console.viewer_joined", "announced to every tab, not to the holder"
        return await group_send(self, group, message)

    monkeypatch.setattr(layer_class, "send", recording_send)
    monkeypatch.setattr(layer_class, "group_send", recording_group_send)
    first = await connected_student(student_a, attempt.id)
    assert announced == []  # alone: nobody to tell, not even a holder
    await first.type(b"echo before-second-$((30+3))\r")
    await first.read_until(lambda v: v.has_output(b"before-second-33"))
    second = await connected_student(student_a, attempt.id)
    assert len(announced) == 1  # to the holder alone, whose channel the lease names
    assert announced[0][0] == await console_state().get("lease", attempt.id)
    # The holder heard it: the newcomer is brought up to date and sees what is typed from now on.
    await second.read_until(lambda v: v.has_output(b"before-second-33"))
    await first.type(b"echo after-second-$((40+4))\r")
    await second.read_until(lambda v: v.has_output(b"after-second-44"))
    await second.close()
    await first.close()


async def test_two_student_tabs_share_one_upstream_and_neither_is_dropped(attempt, cluster, student_a):
    first = await connected_student(student_a, attempt.id)
    second = await open_console(student_a, attempt.id)
    await first.type(b"echo one-$((10+1))\r")
    for tab in (first, second):
        await tab.read_until(lambda v: v.has_output(b"one-11"))
    await second.type(b"echo two-$((10+2))\r")
    for tab in (first, second):
        await tab.read_until(lambda v: v.has_output(b"two-12"))
    assert await sync_to_async(open_consoles)(cluster) == 1
    await first.drain(1.0)
    await second.drain(1.0)
    assert first.closed_with is None and second.closed_with is None
    assert "lost" not in first.statuses() and "lost" not in second.statuses()
    await first.close()
    await second.close()


async def test_holder_leaving_hands_the_upstream_to_the_other_tab(attempt, cluster, student_a):
    holder = await connected_student(student_a, attempt.id)
    other = await open_console(student_a, attempt.id)
    requests_before = await sync_to_async(console_requests)(cluster)
    await holder.close()
    await other.read_until(lambda v: "connecting" in v.statuses() and v.statuses()[-1] == "connected", within=15)
    await other.type(b"echo still-here-$((3*3))\r")
    await other.read_until(lambda v: v.has_output(b"still-here-9"))
    assert await sync_to_async(console_requests)(cluster) == requests_before + 1
    assert await sync_to_async(open_consoles)(cluster) == 1
    await other.close()


async def test_upstream_closes_soon_after_the_last_viewer_leaves(attempt, cluster, student_a):
    first = await connected_student(student_a, attempt.id)
    second = await open_console(student_a, attempt.id)
    assert await sync_to_async(open_consoles)(cluster) == 1
    await first.close()
    await second.close()
    # Nothing but the leaving viewers closes the upstream: left open, it would stay open for good.
    await wait_for(lambda: open_consoles(cluster) == 0, within=20, what="the upstream to close")


async def test_a_tab_closing_as_its_lease_loop_wakes_still_cleans_up(
    attempt, cluster, student_a, monkeypatch, settings
):
    """The holder's lease loop is woken (heartbeat, upstream ending) in the same turn as its tab's close cancels
    it. The consumer must still finish ``disconnect()``: release the upstream and the lease, so that the next tab
    holds the console at once. With asyncio.wait_for in the loop the cancellation was lost, ``disconnect()`` never
    returned, and daphne killed the consumer 10 s later with everything left behind."""
    from labs.consumers.console import AttemptConsoleConsumer

    # A lease left behind would outlive every wait below: it lasts at least 20 s of this from its last renewal.
    settings.CONSOLE_LEASE_TTL_SECONDS = 30.0
    closing = AttemptConsoleConsumer.disconnect

    async def disconnect_as_woken(self, code):
        self.ownership_changed.set()
        await closing(self, code)

    monkeypatch.setattr(AttemptConsoleConsumer, "disconnect", disconnect_as_woken)
    holder = await connected_student(student_a, attempt.id)
    await holder.communicator.send_input({"type": "websocket.disconnect", "code": 1001})
    try:
        # A lost cancellation never returns; a loaded host takes a few seconds at most.
        await asyncio.wait_for(asyncio.shield(holder.communicator.future), 15)
    except TimeoutError:
        holder.communicator.future.cancel()
        pytest.fail("the console consumer did not finish its disconnect()")
    await wait_for(lambda: open_consoles(cluster) == 0, within=15, what="the upstream to close")
    assert await console_state().get("lease", attempt.id) is None, "the lease was left to run out"
    successor = await connected_student(student_a, attempt.id)
    await successor.close()


async def test_a_tab_cancelled_while_leaving_still_hands_back_the_upstream(attempt, cluster, student_a, monkeypatch):
    """A slow cleanup outlasts the wait of whoever closes the consumer (the test communicator cancels it after 1 s,
    daphne after 10 s): the upstream is closed and the lease handed back all the same."""
    from labs.consumers.console import AttemptConsoleConsumer

    stopping = AttemptConsoleConsumer._stop_owning

    async def slow_stop(self, *, release):
        await asyncio.sleep(1.5)  # a Redis or cluster round trip on a loaded machine
        await stopping(self, release=release)

    monkeypatch.setattr(AttemptConsoleConsumer, "_stop_owning", slow_stop)
    holder = await connected_student(student_a, attempt.id)
    await holder.close()  # gives up after 1 s and cancels the consumer
    assert holder.communicator.future.cancelled()
    await wait_for(lambda: open_consoles(cluster) == 0, within=5, what="the upstream to close")
    successor = await connected_student(student_a, attempt.id)
    await successor.close()


async def test_a_new_tab_gets_the_scrollback_first(attempt, cluster, student_a):
    first = await connected_student(student_a, attempt.id)
    await first.type(b"echo remembered-$((20+1))\r")
    await first.read_until(lambda v: v.has_output(b"remembered-21"))
    late = await open_console(student_a, attempt.id)
    # Only the scrollback has it: nothing echoes it again.
    await late.read_until(lambda v: v.has_output(b"remembered-21"))
    await late.type(b"echo fresh-$((20+2))\r")
    await late.read_until(lambda v: v.has_output(b"fresh-22"))
    # Replayed output and live output meet without a doubled chunk.
    assert late.screen.count(b"remembered-21") == first.screen.count(b"remembered-21") == 1
    assert late.screen.count(b"fresh-22") == 1
    await late.close()
    await first.close()


async def test_taking_control_is_audited_and_lets_staff_type(attempt, cluster, student_a, instructor_a):
    student = await connected_student(student_a, attempt.id)
    staff = await open_console(instructor_a, attempt.id)
    await staff.send_json({"type": "take_control"})
    await staff.read_until(lambda v: any(m.get("mode") == "rw" for m in v.messages))
    await student.read_until(lambda v: "control_taken" in v.notices())
    await staff.type(b"echo staff-typed-$((4*4))\r")
    await student.read_until(lambda v: v.has_output(b"staff-typed-16"))
    event = await sync_to_async(AuditEvent.objects.get)(action="console.take_control")
    assert event.actor_id == instructor_a.id and event.target_id == str(attempt.id)
    await staff.send_json({"type": "release_control"})
    await student.read_until(lambda v: "control_released" in v.notices())
    assert await sync_to_async(AuditEvent.objects.filter(action="console.release_control").count)() == 1
    await staff.drain(0.5)
    assert not {"control_taken", "control_released"} & set(staff.notices()), "staff are not told of themselves"
    await staff.close()
    await student.close()


async def test_students_cannot_take_control_messages(attempt, cluster, student_a):
    student = await connected_student(student_a, attempt.id)
    await student.send_json({"type": "take_control"})
    await student.read_until(lambda v: "not_allowed" in v.notices())
    await student.send_json({"type": "something-else"})
    await student.read_until(lambda v: "bad_message" in v.notices())
    await student.communicator.send_to(text_data="[" * 100_000)  # nested deeper than the JSON parser follows
    await student.send_json({"type": "ping"})  # answered: the consumer lived through it
    await student.read_until(lambda v: {"type": "pong"} in v.messages)
    assert not await sync_to_async(AuditEvent.objects.filter(action="console.take_control").exists)()
    await student.close()


@pytest.fixture
def count_stale_connection_closes(monkeypatch):
    """Call it once the socket is open: from then on, each of channels' stale-connection closes (a worker-thread
    hop) is counted in the list it returns."""
    import channels.db

    calls: list[int] = []
    original = channels.db.close_old_connections

    def counting(**kwargs):
        calls.append(1)
        return original(**kwargs)

    def start() -> list[int]:
        monkeypatch.setattr(channels.db, "close_old_connections", counting)
        return calls

    return start


async def test_typing_takes_no_worker_thread_per_keystroke(
    attempt, cluster, student_a, monkeypatch, count_stale_connection_closes
):
    """channels' own dispatch closes stale database connections in a worker thread before every message; with
    hundreds of typists that thread hop was most of a daphne's work. Typing, acknowledging and pinging must not
    touch the database layer at all."""
    student = await connected_student(student_a, attempt.id)
    calls = count_stale_connection_closes()
    for key in b"echo typed-$((40+2))":
        await student.type(bytes([key]))
    await student.type(b"\r")
    await student.read_until(lambda v: v.has_output(b"typed-42"))
    await student.send_json({"type": "ack", "bytes": student.received})
    await student.send_json({"type": "ping"})
    await student.read_until(lambda v: {"type": "pong"} in v.messages)
    assert calls == []
    monkeypatch.undo()
    await student.close()


# -- limits, loss and recovery, recording ---------------------------------------------------------------------


async def test_oversized_input_frames_are_refused(attempt, cluster, student_a, settings):
    student = await connected_student(student_a, attempt.id)
    await student.type(b"echo " + b"x" * (64 * 1024) + b"\r")
    await student.read_until(lambda v: "input_too_large" in v.notices())
    await student.type(b"echo ok-$((5+5))\r")
    await student.read_until(lambda v: v.has_output(b"ok-10"))
    assert b"x" * 100 not in student.output
    await student.close()


async def test_a_browser_that_stops_acknowledging_gets_skipped_then_redrawn(attempt, cluster, student_a, settings):
    settings.CONSOLE_OUTPUT_WINDOW_BYTES = 8 * 1024
    student = await connected_student(student_a, attempt.id)
    await student.type(b"seq 1 20000; echo done-$((9*9))\r")
    await student.read_until(lambda v: any(m["type"] == "lagging" for m in v.messages))
    await student.drain(2.0)
    # Not acknowledged: what reached this viewer stays near the window, far below the ~110 KB produced.
    assert len(student.output) < 3 * 8 * 1024
    await student.send_json({"type": "ack", "bytes": len(student.output)})
    await student.read_until(lambda v: any(m["type"] == "reset" for m in v.messages))
    await student.read_until(lambda v: v.has_output(b"done-81"))
    await student.close()


async def test_a_large_output_reaches_a_browser_that_keeps_up(attempt, cluster, student_a):
    student = await connected_student(student_a, attempt.id)
    student.acknowledges = True
    await student.type(b"seq 1 300000; echo finished-$((8*8))\r")  # about 2 MB: twice the output window
    await student.read_until(lambda v: v.has_output(b"finished-64"), within=90)
    assert b"\r\n299999\r\n300000\r\n" in student.output
    # Test client and bridge share one event loop, so the client may fall behind now and then; if it did, it
    # was redrawn and is not left lagging.
    flow = [m["type"] for m in student.messages if m["type"] in ("lagging", "reset")]
    assert not flow or flow[-1] == "reset"
    await student.close()


async def test_upstream_loss_is_reported_and_recovered(attempt, cluster, student_a):
    student = await connected_student(student_a, attempt.id)
    await sync_to_async(cluster.admin.disconnect_consoles)(namespace=attempt.namespace, name=attempt.vm_name)
    await student.read_until(lambda v: "lost" in v.statuses())
    await student.read_until(lambda v: v.statuses()[-1] == "connected", within=15)
    await student.type(b"echo recovered-$((6+6))\r")
    await student.read_until(lambda v: v.has_output(b"recovered-12"))
    await student.close()


async def test_output_is_recorded_as_asciicast_v2(attempt, cluster, student_a):
    student = await connected_student(student_a, attempt.id)
    await student.type(b"echo recorded-$((7*7))\r")
    await student.read_until(lambda v: v.has_output(b"recorded-49"))
    await student.close()
    lines = recording_path(attempt_id=attempt.id).read_text().splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2 and header["width"] > 0 and header["height"] > 0
    events = [json.loads(line) for line in lines[1:]]
    times = [event[0] for event in events]
    assert times == sorted(times)
    assert any(kind == "o" and "recorded-49" in text for _, kind, text in events)


@pytest.mark.parametrize("fresh_seconds", [2.0, 0.0])
async def test_a_console_opened_on_a_running_vmi_dials_with_what_its_handshake_read(
    attempt, cluster, student_a, monkeypatch, fresh_seconds
):
    lookups = []
    looked_up = console_consumer._console_location

    async def counted(**kwargs):
        lookups.append(kwargs["attempt_id"])
        return await looked_up(**kwargs)

    monkeypatch.setattr(console_consumer, "_console_location", counted)
    monkeypatch.setattr(console_consumer, "HANDSHAKE_LOCATION_FRESH_SECONDS", fresh_seconds)
    student = await connected_student(student_a, attempt.id)
    # Fresh, the location the handshake read serves the first dial; stale, it is looked up again.
    assert lookups == ([] if fresh_seconds else [attempt.id])
    # Every later dial looks the attempt up afresh.
    await sync_to_async(cluster.admin.disconnect_consoles)(namespace=attempt.namespace, name=attempt.vm_name)
    await student.read_until(lambda v: "lost" in v.statuses())
    await student.read_until(lambda v: v.statuses()[-1] == "connected", within=15)
    assert lookups == ([attempt.id] if fresh_seconds else [attempt.id, attempt.id])
    await student.close()


async def test_a_lone_holder_tells_nobody_its_status_yet_a_tab_that_arrives_learns_it(
    attempt, cluster, student_a, monkeypatch
):
    sent = []
    layer = get_channel_layer()
    group_send = layer.group_send

    async def counting_group_send(group, message):
        sent.append(message["type"])
        return await group_send(group, message)

    monkeypatch.setattr(layer, "group_send", counting_group_send)
    first = await connected_student(student_a, attempt.id)
    assert "console.status" not in sent  # connecting, connected: its own browser only
    second = await open_console(student_a, attempt.id)
    await second.read_until(lambda v: v.statuses() == ["connected"])  # the holder's answer to its arrival
    # From then on a change reaches both.
    await sync_to_async(cluster.admin.disconnect_consoles)(namespace=attempt.namespace, name=attempt.vm_name)
    for tab in (first, second):
        await tab.read_until(lambda v: "lost" in v.statuses() and v.statuses()[-1] == "connected", within=15)
    assert "console.status" in sent
    await first.close()
    await second.close()


async def test_console_waits_like_virtctl_while_the_vmi_is_not_running(cluster, student_a, lab_a):
    from labs.services import attempt_provision, attempt_start
    from tests.browser.attempts import attempt_run_to

    delays = await sync_to_async(cluster.admin.configure)()
    await sync_to_async(cluster.admin.configure)(scheduled_delay=8.0)
    try:
        attempt = await sync_to_async(attempt_start)(actor=student_a, lab=lab_a)
        await sync_to_async(attempt_provision)(attempt_id=attempt.id)
        before = await sync_to_async(console_requests)(cluster)
        student = await open_console(student_a, attempt.id)
        # Its own thread: the consumer's database calls must not queue behind this loop.
        syncing = asyncio.ensure_future(
            sync_to_async(attempt_run_to, thread_sensitive=False)(attempt=attempt, timeout=60)
        )
        await student.read_until(lambda v: "waiting" in v.statuses())
        await asyncio.sleep(2.0)
        dialled = await sync_to_async(console_requests)(cluster) - before
        # Nothing is dialled while the VMI is Scheduling/Scheduled (the cluster would only refuse it): the
        # console waits for the update that shows the VMI Running.
        assert dialled == 0, dialled
        await student.read_until(lambda v: v.statuses()[-1] == "connected", within=30)
        await syncing
        await student.type(b"echo up-$((2*21))\r")
        await student.read_until(lambda v: v.has_output(b"up-42"))
        await student.close()
    finally:
        await sync_to_async(cluster.admin.configure)(**{k: v for k, v in delays.items() if k.endswith("delay")})


def test_a_students_own_console_is_decided_in_one_query(attempt, student_a, ta_a, django_assert_num_queries):
    from labs.console.access import console_access

    with django_assert_num_queries(1):
        access = console_access(user=student_a, attempt_id=attempt.id)
    assert access is not None and access.is_student
    # Somebody else's: not their own, then the attempts of the courses they teach (which makes them course staff).
    with django_assert_num_queries(2):
        access = console_access(user=ta_a, attempt_id=attempt.id)
    assert access is not None and not access.is_student


async def test_ended_attempt_reports_ended_instead_of_dialling(cluster, student_a, lab_a):
    attempt = await sync_to_async(running_attempt)(student=student_a, lab=lab_a)
    from labs.models import Attempt

    await sync_to_async(Attempt.objects.filter(pk=attempt.pk).update)(state=AttemptState.STOPPED)
    before = await sync_to_async(console_requests)(cluster)
    student = await open_console(student_a, attempt.id)
    await student.read_until(lambda v: "ended" in v.statuses())
    assert await sync_to_async(console_requests)(cluster) == before
    await student.close()


# -- attempt events ---------------------------------------------------------------------------------------------


async def test_events_socket_sends_the_current_status_then_pushes(attempt, cluster, student_a, ta_a):
    viewer = await open_events(student_a, attempt.id)
    first = viewer.messages[0]
    assert first["type"] == "attempt.update" and first["attempt"]["state"] == "running"
    assert first["attempt"]["timestamps"]["agent_ready"] is not None

    await sync_to_async(attempt_extend)(actor=student_a, attempt=attempt)
    await viewer.read_until(
        lambda v: any(m["type"] == "attempt.update" and m["attempt"]["extensions"] == 1 for m in v.messages)
    )
    await get_channel_layer().group_send(f"attempt-{attempt.id}", {"type": "grading.update", "run": {"id": 7}})
    await viewer.read_until(lambda v: {"type": "grading.update", "run": {"id": 7}} in v.messages)
    await viewer.close()

    # A page that reconnects starts from the present state.
    staff = await open_events(ta_a, attempt.id)
    assert staff.messages[0]["attempt"]["extensions"] == 1
    await staff.close()


class ClosingSocket:
    """The portal's ASGI application behind daphne between a browser's close frame and the end of its connection:
    once ``closing``, every send is refused with autobahn's ``Disconnected``, as daphne refuses it; the
    ``websocket.disconnect`` follows when the test closes the communicator."""

    def __init__(self) -> None:
        self.closing = False
        self.refused = 0

    async def __call__(self, scope, receive, send):
        from autobahn.exception import Disconnected

        async def refusing_send(message):
            if self.closing and message["type"] == "websocket.send":
                self.refused += 1
                raise Disconnected("Attempt to send on a closed protocol")
            await send(message)

        return await application(scope, receive, refusing_send)


async def group_size(group: str) -> int:
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # the in-memory layer
        return len(layer.groups.get(group, {}))
    async with layer.connection(layer.consistent_hash(group)) as connection:
        return await connection.zcard(layer._group_key(group))


async def test_a_push_to_a_closing_events_socket_is_dropped_and_the_socket_still_leaves_its_group(
    attempt, cluster, student_a
):
    group = f"attempt-{attempt.id}"
    before = await group_size(group)
    socket = ClosingSocket()
    viewer = await open_events(student_a, attempt.id, app=socket)
    assert await group_size(group) == before + 1

    socket.closing = True  # the tab is closed; a grading result is pushed before the connection is gone
    await get_channel_layer().group_send(group, {"type": "grading.update", "run": {"id": 7}})
    await wait_for(lambda: socket.refused == 1, what="the push to reach the closing socket")
    await asyncio.sleep(0.1)
    assert not viewer.communicator.future.done(), "the consumer died of a push to a closing socket"
    await viewer.close()  # websocket.disconnect: raises whatever the consumer died of
    assert await group_size(group) == before


async def test_console_output_for_a_closing_tab_is_dropped_and_the_other_tab_goes_on(attempt, cluster, student_a):
    closing = ClosingSocket()
    leaving = await connected_student(student_a, attempt.id, app=closing)
    staying = await connected_student(student_a, attempt.id)
    closing.closing = True
    await staying.type(b"echo first-$((6*7))\r")
    await staying.read_until(lambda v: v.has_output(b"first-42"))
    await wait_for(lambda: closing.refused >= 1, what="output to reach the closing tab")
    await asyncio.sleep(0.1)
    assert not leaving.communicator.future.done(), "the consumer died of output for a closing tab"
    await leaving.close()  # it held the upstream: the other tab takes it over, as from any tab that leaves
    await staying.read_until(lambda v: "connecting" in v.statuses() and v.statuses()[-1] == "connected", within=15)
    await staying.type(b"echo second-$((6*7))\r")
    await staying.read_until(lambda v: v.has_output(b"second-42"))
    await staying.close()


async def test_pushes_to_the_events_socket_take_no_worker_thread(
    attempt, cluster, student_a, count_stale_connection_closes
):
    """As for the console's keystrokes: a push or a ping is relayed without channels' stale-connection close in a
    worker thread (a thread hop per message, on the process's one thread for such calls)."""
    viewer = await open_events(student_a, attempt.id)
    calls = count_stale_connection_closes()
    for number in range(3):
        await get_channel_layer().group_send(f"attempt-{attempt.id}", {"type": "grading.update", "run": {"id": number}})
    await viewer.send_json({"type": "ping"})
    await viewer.read_until(
        lambda v: {"type": "pong"} in v.messages and {"type": "grading.update", "run": {"id": 2}} in v.messages
    )
    assert calls == []
    await viewer.close()


async def test_the_events_socket_answers_what_it_does_not_understand_and_goes_on(attempt, cluster, student_a):
    viewer = await open_events(student_a, attempt.id)
    await viewer.communicator.send_to(text_data="not json")
    await viewer.communicator.send_to(bytes_data=b"\x00\x01")
    await viewer.send_json({"type": "subscribe", "attempt": attempt.id + 1})
    await viewer.communicator.send_to(text_data="[" * 100_000)  # nested deeper than the JSON parser follows
    await viewer.send_json({"type": "ping"})
    await viewer.read_until(lambda v: {"type": "pong"} in v.messages)
    assert viewer.messages[1:] == [{"type": "error", "code": "bad_message"}] * 4 + [{"type": "pong"}]
    await get_channel_layer().group_send(f"attempt-{attempt.id}", {"type": "grading.update", "run": {"id": 7}})
    await viewer.read_until(lambda v: {"type": "grading.update", "run": {"id": 7}} in v.messages)
    await viewer.close()


def finished_run_with_a_pattern_timeout(attempt):
    from grading.models import CheckResult, GradingRun, RunState

    run = GradingRun.objects.create(attempt=attempt, state=RunState.DONE, score=0, max_score=1)
    CheckResult.objects.create(run=run, check_title="Output", order=1, max_points=1, pattern_timeout_seconds=0.1)
    return run


async def test_events_socket_speaks_the_language_of_its_page(attempt, cluster, student_a):
    """The snapshot and the pushes are in the page's language (cookie, then Accept-Language), whatever the
    language of the worker that graded."""
    from grading.services.runs import push_run_on_commit

    run = await sync_to_async(finished_run_with_a_pattern_timeout)(attempt)
    cookie = await sync_to_async(session_cookie)(student_a)
    path = f"/ws/attempts/{attempt.id}/events/"
    japanese = Viewer(path, [ORIGIN, HOST, (b"cookie", cookie), (b"accept-language", b"ja,en;q=0.5")])
    chosen_english = Viewer(
        path,
        [
            ORIGIN,
            HOST,
            (b"cookie", cookie + f"; {settings.LANGUAGE_COOKIE_NAME}=en".encode()),
            (b"accept-language", b"ja"),
        ],
    )
    viewers = (japanese, chosen_english)
    for viewer in viewers:
        assert (await viewer.connect())[0]

    def feedback(viewer, count):
        runs = [m["run"] for m in viewer.messages if m["type"] == "grading.update"]
        return runs[count - 1]["results"][0]["feedback"] if len(runs) >= count else None

    for viewer in viewers:
        await viewer.read_until(lambda v: feedback(v, 1) is not None)
    assert feedback(japanese, 1).startswith("このチェックは判定できませんでした") and "0.1 秒" in feedback(japanese, 1)
    assert feedback(chosen_english, 1).startswith("This check could not be judged") and "0.1 s" in feedback(
        chosen_english, 1
    )

    await sync_to_async(push_run_on_commit)(run=run)  # as the worker pushes once it has graded
    for viewer in viewers:
        await viewer.read_until(lambda v: feedback(v, 2) is not None)
    assert feedback(japanese, 2) == feedback(japanese, 1)
    assert feedback(chosen_english, 2) == feedback(chosen_english, 1)
    for viewer in viewers:
        await viewer.close()


async def test_why_an_attempt_failed_reaches_each_socket_in_its_own_language(
    attempt, cluster, student_a, ta_a, monkeypatch
):
    """A worker words a failure in every language; the push carries them all, and each page (the Japanese
    student's, an English TA's) shows its own, in the push and in the snapshot of a socket opened later."""
    from labs.services import provisioning

    monkeypatch.setattr(provisioning, "enqueue_teardown", lambda attempt_id: None)  # the VM is not the point here
    await sync_to_async(Attempt.objects.filter(id=attempt.id).update)(language="ja")
    path = f"/ws/attempts/{attempt.id}/events/"
    student = Viewer(
        path, [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(student_a)), (b"accept-language", b"ja")]
    )
    ta = Viewer(
        path, [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(ta_a)), (b"accept-language", b"en")]
    )
    for viewer in (student, ta):
        assert (await viewer.connect())[0]
        await viewer.read_until(lambda v: len(v.messages) >= 1)

    def fail() -> None:
        with translation.override("en"):  # a worker's language is nobody's in particular
            assert provisioning.attempt_fail(
                attempt_id=attempt.id, reason=lambda: gettext("The VM was deleted outside the portal.")
            )

    await sync_to_async(fail)()

    def failure(viewer):
        failed = [
            m["attempt"] for m in viewer.messages if m["type"] == "attempt.update" and m["attempt"]["state"] == "failed"
        ]
        return failed[-1]["failure_reason"] if failed else None

    for viewer in (student, ta):
        await viewer.read_until(lambda v: failure(v) is not None)
    assert failure(student) == "仮想マシンがポータルの外で削除されました。"
    assert failure(ta) == "The VM was deleted outside the portal."
    stored = await sync_to_async(Attempt.objects.get)(id=attempt.id)
    assert stored.failure_reason == failure(student)  # the text field keeps the student's language
    later = await open_events(ta_a, attempt.id)  # no Accept-Language: the default, English
    assert later.messages[0]["attempt"]["failure_reason"] == "The VM was deleted outside the portal."
    for viewer in (student, ta, later):
        await viewer.close()


async def test_the_cluster_notice_reaches_each_socket_in_its_own_language(attempt, cluster, student_a, ta_a):
    from labs.services.events import cluster_notice_push

    path = f"/ws/attempts/{attempt.id}/events/"
    student = Viewer(
        path, [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(student_a)), (b"accept-language", b"ja")]
    )
    ta = Viewer(path, [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(ta_a))])
    for viewer in (student, ta):
        assert (await viewer.connect())[0]
        await viewer.read_until(lambda v: len(v.messages) >= 1)

    def notices(viewer) -> list[str]:
        return [m["notice"] for m in viewer.messages if m["type"] == "cluster.notice"]

    # As the sync task pushes when the loop falls behind.
    await sync_to_async(cluster_notice_push)(troubles={attempt.namespace: "sync"})
    for viewer in (student, ta):
        await viewer.read_until(lambda v: len(notices(v)) == 1)
    delayed = "Lab status updates are delayed; what you see here may be out of date for a while."
    with translation.override("ja"):
        japanese = gettext(delayed)
    assert japanese != delayed and notices(student) == [japanese]
    assert notices(ta) == [delayed]  # the page's script shows it to the student only
    await sync_to_async(cluster_notice_push)(troubles={attempt.namespace: ""})
    for viewer in (student, ta):
        await viewer.read_until(lambda v: notices(v)[1:] == [""])
        await viewer.close()


async def test_a_page_showing_a_notice_is_told_the_present_one_as_its_socket_opens(attempt, cluster, student_a):
    path = f"/ws/attempts/{attempt.id}/events/"
    headers = [ORIGIN, HOST, (b"cookie", await sync_to_async(session_cookie)(student_a))]
    await sync_to_async(record_sync_success)()  # the cluster answers and the sync is fresh: no notice now
    asking, quiet = Viewer(path + "?notice=1", headers), Viewer(path, headers)
    for viewer in (asking, quiet):
        assert (await viewer.connect())[0]
        await viewer.read_until(lambda v: len(v.messages) >= 1)
    await asking.read_until(lambda v: any(m["type"] == "cluster.notice" for m in v.messages))
    assert [m["notice"] for m in asking.messages if m["type"] == "cluster.notice"] == [""]
    # A page without a notice costs the handshake nothing more.
    await quiet.drain(1.0)
    assert [m["type"] for m in quiet.messages] == [m["type"] for m in asking.messages if m["type"] != "cluster.notice"]
    for viewer in (asking, quiet):
        await viewer.close()


# -- embedded mode ----------------------------------------------------------------------------------------------


@pytest.fixture
def embedded_mode(settings):
    """No Redis: the in-memory channel layer and the process-local lease and scrollback."""
    settings.REDIS_URL = None
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


async def test_embedded_mode_shares_one_upstream_and_hands_it_over(embedded_mode, attempt, cluster, student_a):
    first = await connected_student(student_a, attempt.id)
    second = await open_console(student_a, attempt.id)
    await second.type(b"echo embedded-$((30+3))\r")
    for tab in (first, second):
        await tab.read_until(lambda v: v.has_output(b"embedded-33"))
    assert await sync_to_async(open_consoles)(cluster) == 1
    await first.close()
    await second.read_until(lambda v: "connecting" in v.statuses() and v.statuses()[-1] == "connected", within=15)
    await second.type(b"echo handed-over-$((30+4))\r")
    await second.read_until(lambda v: v.has_output(b"handed-over-34"))
    await second.close()
    await wait_for(lambda: open_consoles(cluster) == 0, within=5, what="the upstream to close")
