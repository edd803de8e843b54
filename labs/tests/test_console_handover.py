"""Taking and handing back the console's upstream when a tab closes at any moment of the hand-over.

A tab that closes while its consumer is taking the lease (acquiring it, reading the viewers, opening the
recording, joining the input group) must leave nothing behind: no lease renewed for it, no task of its own still
running, and the next tab holds the console at once. Also the session metrics, counted through real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from asgiref.sync import sync_to_async

from labs.console.state import LocalConsoleState, RedisConsoleState, console_state
from labs.tests import console_lease_settings
from labs.tests.test_consumers import (  # noqa: F401 - the autouse fixtures apply here too
    ORIGIN,
    Viewer,
    connected_student,
    fast_password_hasher,
    isolated_console_state,
    open_console,
    open_consoles,
    session_cookie,
    wait_for,
)
from portal import metrics
from tests.browser.attempts import running_attempt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# A lease a gone tab kept (or one a leftover task renews) would hold the next tab back for most of this; the next
# tab's waits are a fraction of it, however loaded the host.
LONG_LEASE_SECONDS = console_lease_settings.CONSOLE_LEASE_TTL_SECONDS


@pytest.fixture
def attempt(cluster, student_a, lab_a):
    return running_attempt(student=student_a, lab=lab_a)


def console_tasks(attempt_id: int) -> list[asyncio.Task]:
    """This loop's tasks that belong to the attempt's console (named ``console-<id>-...``)."""
    return [
        task for task in asyncio.all_tasks() if task.get_name().startswith(f"console-{attempt_id}-") and not task.done()
    ]


async def handed_back(attempt_id: int) -> None:
    """Wait until no lease and no console task is left. A consumer may still be leaving when its socket's close
    returns (the communicator waits 1 s for it, then cancels it); what it left behind would stay, the lease for the
    long lease and a task renewing it for good."""
    deadline = time.monotonic() + 10
    while True:
        lease, tasks = await console_state().get("lease", attempt_id), console_tasks(attempt_id)
        if lease is None and not tasks:
            return
        assert time.monotonic() < deadline, f"left behind: the lease {lease!r}, tasks {tasks}"
        await asyncio.sleep(0.05)


def stalled_once(original, reached: asyncio.Event, *, when=lambda *args, **kwargs: True):
    """``original``, except that its first call matching ``when`` does its work, then stalls until cancelled
    (a Redis reply or a disk write still on its way as the tab closes)."""
    stalled = False

    async def stall(*args, **kwargs):
        nonlocal stalled
        result = await original(*args, **kwargs)
        if not stalled and when(*args, **kwargs):
            stalled = True
            reached.set()
            await asyncio.sleep(60)
        return result

    return stall


def stall_point(point: str, monkeypatch, reached: asyncio.Event) -> None:
    from channels.layers import get_channel_layer

    from labs.console.recording import AsciicastRecorder

    if point == "lease_acquire":
        for cls in (RedisConsoleState, LocalConsoleState):
            monkeypatch.setattr(cls, "lease_acquire", stalled_once(cls.lease_acquire, reached))
    elif point == "viewers_look":
        for cls in (RedisConsoleState, LocalConsoleState):
            monkeypatch.setattr(cls, "viewers_others", stalled_once(cls.viewers_others, reached))
    elif point == "recording_open":
        monkeypatch.setattr(AsciicastRecorder, "open", stalled_once(AsciicastRecorder.open, reached))
    elif point == "input_group_join":
        layer_class = type(get_channel_layer())
        monkeypatch.setattr(
            layer_class,
            "group_add",
            stalled_once(
                layer_class.group_add, reached, when=lambda self, group, channel: group.startswith("console-input-")
            ),
        )
    else:
        raise AssertionError(point)


@pytest.mark.parametrize("point", ["lease_acquire", "viewers_look", "recording_open", "input_group_join"])
async def test_a_tab_closed_while_taking_the_console_leaves_nothing_behind(
    point, attempt, cluster, student_a, monkeypatch, settings
):
    settings.CONSOLE_LEASE_TTL_SECONDS = LONG_LEASE_SECONDS
    reached = asyncio.Event()
    stall_point(point, monkeypatch, reached)
    leaving = await open_console(student_a, attempt.id)
    await asyncio.wait_for(reached.wait(), 10)
    await leaving.close()
    await handed_back(attempt.id)

    successor = await open_console(student_a, attempt.id)
    await successor.read_until(lambda v: "connected" in v.statuses(), within=10)
    await successor.type(b"echo after-$((40+2))\r")
    await successor.read_until(lambda v: v.has_output(b"after-42"))
    await successor.close()
    await wait_for(lambda: open_consoles(cluster) == 0, within=10, what="the upstream to close")
    await handed_back(attempt.id)


async def test_a_start_that_fails_half_way_hands_back_and_tries_again(attempt, cluster, student_a, monkeypatch):
    """Redis or the disk fails while the viewer takes the console (here: opening the recording): what it took is
    handed back, and its next try holds the console, instead of a lease renewed for a holder without upstream."""
    from labs.console.recording import AsciicastRecorder

    opening = AsciicastRecorder.open
    failures = []

    async def fails_once(self):
        if not failures:
            failures.append(self)
            raise ConnectionError("Redis went away")
        await opening(self)

    monkeypatch.setattr(AsciicastRecorder, "open", fails_once)
    viewer = await open_console(student_a, attempt.id)
    # The next try comes a second after the failure; without one the viewer would never connect.
    await viewer.read_until(lambda v: "connected" in v.statuses(), within=15)
    assert await console_state().get("lease", attempt.id) is not None
    assert len([task for task in console_tasks(attempt.id) if task.get_name().endswith("-fanout")]) == 1
    await viewer.type(b"echo retried-$((40+2))\r")
    await viewer.read_until(lambda v: v.has_output(b"retried-42"))
    await viewer.close()
    assert await console_state().get("lease", attempt.id) is None


async def test_the_holder_renews_its_lease_and_hands_over_one_somebody_else_took(attempt, cluster, student_a, settings):
    # Renewed every 0.8 s: a renewal may come 1.6 s late on a loaded host before the lease runs out.
    settings.CONSOLE_LEASE_TTL_SECONDS = 2.4
    viewer = await connected_student(student_a, attempt.id)
    state = console_state()
    holder = await state.get("lease", attempt.id)
    assert holder is not None
    await asyncio.sleep(5.0)  # two lease lifetimes: kept alive by its renewals alone
    assert await state.get("lease", attempt.id) == holder
    await state.delete("lease", attempt.id)  # ran out unrenewed, and nobody took it: taken again
    deadline = time.monotonic() + 10
    while await state.get("lease", attempt.id) != holder:
        assert time.monotonic() < deadline, "the holder did not take its lease again"
        await asyncio.sleep(0.05)

    # Ran out again, and a viewer elsewhere took it: the holder hands the upstream over without releasing.
    await state.delete("lease", attempt.id)
    assert await state.lease_acquire(attempt_id=attempt.id, holder="elsewhere", ttl=30) == 2
    await wait_for(lambda: open_consoles(cluster) == 0, within=10, what="the upstream to be handed over")
    assert await state.get("lease", attempt.id) == "elsewhere"
    await state.lease_release(attempt_id=attempt.id, holder="elsewhere")
    await viewer.read_until(lambda v: v.statuses().count("connected") == 2, within=10)  # and takes it once free
    await viewer.close()


async def test_a_holder_leaving_while_the_newcomer_asks_for_the_lease_hands_over_at_once(
    attempt, cluster, student_a, monkeypatch, settings
):
    """The holder leaves and says so while the newcomer's ask for the lease is on its way back (refused): the
    newcomer takes the console at once, not a third of a lease (8 s) later."""
    settings.CONSOLE_LEASE_TTL_SECONDS = LONG_LEASE_SECONDS
    holder = await connected_student(student_a, attempt.id)
    refused, holder_gone = asyncio.Event(), asyncio.Event()

    def wrap(original):
        async def refused_late(self, **kwargs):
            taken = await original(self, **kwargs)
            if not taken and not refused.is_set():
                refused.set()
                await holder_gone.wait()
            return taken

        return refused_late

    for cls in (RedisConsoleState, LocalConsoleState):
        monkeypatch.setattr(cls, "lease_acquire", wrap(cls.lease_acquire))
    newcomer = await open_console(student_a, attempt.id)
    await asyncio.wait_for(refused.wait(), 10)
    await holder.close()
    state = console_state()
    await wait_for(lambda: open_consoles(cluster) == 0, within=10, what="the holder's upstream to close")
    await asyncio.sleep(0.5)  # the holder's owner_gone reaches the newcomer while its refusal is still on its way
    holder_gone.set()
    handed = time.monotonic()
    while await state.get("lease", attempt.id) is None:
        assert time.monotonic() - handed < 4.0, "the newcomer waited for its next beat"
        await asyncio.sleep(0.05)
    await newcomer.close()


async def test_a_tab_whose_announcement_was_lost_asks_again_and_gets_a_status(attempt, cluster, student_a, monkeypatch):
    """The holder never hears a newcomer (its announcement fell off a full channel): the newcomer announces itself
    again, rather than showing the scrollback without a status for good."""
    from channels.layers import get_channel_layer

    holder = await connected_student(student_a, attempt.id)
    layer_class = type(get_channel_layer())
    send = layer_class.send
    dropped = []

    async def dropping_the_first_announcement(self, channel, message):
        if message["type"] == "console.viewer_joined" and not dropped:
            dropped.append(message)
            return
        await send(self, channel, message)

    monkeypatch.setattr(layer_class, "send", dropping_the_first_announcement)
    newcomer = await open_console(student_a, attempt.id)
    # It asks again a third of a lease (2 s) after the first; had it not, no status would ever come.
    await newcomer.read_until(lambda v: v.statuses(), within=15)
    assert dropped and newcomer.statuses() == ["connected"]
    await newcomer.close()
    await holder.close()


async def test_a_consumer_that_ends_without_disconnect_still_hands_the_console_back(
    attempt, cluster, student_a, settings
):
    """The server cancels a consumer outright (daphne gives up on one, a test communicator times out): the
    upstream, the lease and its tasks go with it."""
    settings.CONSOLE_LEASE_TTL_SECONDS = LONG_LEASE_SECONDS
    holder = await connected_student(student_a, attempt.id)
    holder.communicator.future.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holder.communicator.future  # its clean-up runs to the end, shielded from the cancellation
    await wait_for(lambda: open_consoles(cluster) == 0, within=10, what="the upstream to close")
    await handed_back(attempt.id)
    successor = await open_console(student_a, attempt.id)
    await successor.read_until(lambda v: "connected" in v.statuses(), within=10)
    await successor.close()


def console_session_figures(settings) -> tuple[float, float]:
    """``portal_console_sessions_opened_total`` and ``portal_console_sessions_active`` as /metrics serves them."""
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    settings.METRICS_TOKEN = "console-metrics-token"
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer console-metrics-token")
    assert response.status_code == 200
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    return samples["portal_console_sessions_opened_total"], samples["portal_console_sessions_active"]


async def test_console_sessions_are_counted_as_sockets_open_and_close(attempt, cluster, student_a, ta_a, settings):
    await sync_to_async(metrics.counters.clear)(metrics.CONSOLE_SESSIONS_KEY)
    student = await connected_student(student_a, attempt.id)
    ta = await open_console(ta_a, attempt.id)
    assert await sync_to_async(console_session_figures)(settings) == (2, 2)
    await ta.close()
    assert await sync_to_async(console_session_figures)(settings) == (2, 1)
    await student.close()
    assert await sync_to_async(console_session_figures)(settings) == (2, 0)


async def test_a_refused_console_socket_is_not_counted(attempt, cluster, student_b, settings):
    await sync_to_async(metrics.counters.clear)(metrics.CONSOLE_SESSIONS_KEY)
    viewer = Viewer(
        f"/ws/attempts/{attempt.id}/console/", [ORIGIN, (b"cookie", await sync_to_async(session_cookie)(student_b))]
    )
    connected, _ = await viewer.connect()
    assert not connected
    await viewer.communicator.disconnect()  # the consumer ends when its connection does, as under daphne
    assert await sync_to_async(console_session_figures)(settings) == (0, 0)
