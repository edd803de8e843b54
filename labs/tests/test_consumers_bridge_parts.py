"""The console bridge's parts on their own: lease, scrollback offsets, flow control, recording, fan-out, and the
process-wide parts that let one daphne serve hundreds of consoles."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from channels.layers import InMemoryChannelLayer
from django.conf import settings

from labs.console import recording
from labs.console.fanout import OutputFanout
from labs.console.flow import InputRateLimiter, OutputWindow
from labs.console.recording import AsciicastRecorder, recording_path
from labs.console.state import LocalConsoleState, RedisConsoleState, shared_redis, tail_for_replay
from labs.console.upstream import ConsoleLocation, ConsoleUpstream, UpstreamState
from labs.consumers.console import AttemptConsoleConsumer
from labs.selectors import console_stage


async def clear_console_keys(client) -> None:
    keys = [key async for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}portal:console:*")]
    if keys:
        await client.delete(*keys)


# -- lease ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_lease_has_one_holder_until_released_or_expired(backend, settings):
    if backend == "redis":
        client = shared_redis()
        await clear_console_keys(client)
        state = RedisConsoleState(client)
    else:
        state = LocalConsoleState()
    attempt_id = 424242
    # Leases that must not run out mid-test last 30 s, however slowly a loaded host gets through the steps.
    assert await state.lease_acquire(attempt_id=attempt_id, holder="tab-1", ttl=30) == 2  # taken
    assert not await state.lease_acquire(attempt_id=attempt_id, holder="tab-2", ttl=30)
    assert await state.get("lease", attempt_id) == "tab-1"
    await state.lease_release(attempt_id=attempt_id, holder="tab-2")  # not the holder: nothing happens
    assert await state.get("lease", attempt_id) == "tab-1"
    assert await state.lease_acquire(attempt_id=attempt_id, holder="tab-1", ttl=30) == 1  # renewed
    await state.lease_release(attempt_id=attempt_id, holder="tab-1")
    assert await state.lease_acquire(attempt_id=attempt_id, holder="tab-2", ttl=0.3)
    # tab-2's process died: it stops renewing and the lease runs out.
    deadline = time.monotonic() + 10
    while await state.get("lease", attempt_id) is not None:
        assert time.monotonic() < deadline, "the lease never ran out"
        await asyncio.sleep(0.05)
    assert await state.lease_acquire(attempt_id=attempt_id, holder="tab-3", ttl=30)
    # tab-3's first answer was lost (its call cancelled or failed after Redis did the work): asking again is fine.
    assert await state.lease_acquire(attempt_id=attempt_id, holder="tab-3", ttl=30)
    assert not await state.lease_acquire(attempt_id=attempt_id, holder="tab-4", ttl=30)
    await state.lease_release(attempt_id=attempt_id, holder="tab-3")


# -- scrollback -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_scrollback_keeps_the_tail_and_a_running_offset(backend, settings):
    settings.CONSOLE_SCROLLBACK_BYTES = 100
    if backend == "redis":
        client = shared_redis()
        await clear_console_keys(client)
        state = RedisConsoleState(client)
    else:
        LocalConsoleState.scrollbacks.pop(777, None)
        state = LocalConsoleState()
    assert (await state.scrollback_snapshot(attempt_id=777)).end == 0
    ends = [await state.scrollback_append(attempt_id=777, data=f"line {i:03d}\n".encode()) for i in range(50)]
    assert ends == [9 * (i + 1) for i in range(50)]
    snapshot = await state.scrollback_snapshot(attempt_id=777)
    assert snapshot.end == 450
    assert len(snapshot.data) <= 100 and snapshot.data.endswith(b"line 049\n")
    assert snapshot.data.startswith(b"line ")  # cut at a line boundary


def test_tail_for_replay_starts_on_a_line_when_it_can():
    assert tail_for_replay(b"abc", 10) == b"abc"
    assert tail_for_replay(b"0123456789\nabcdef", 10) == b"abcdef"
    assert tail_for_replay(b"x" * 50, 10) == b"x" * 10


# -- flow control ---------------------------------------------------------------------------------------------


def test_input_rate_limiter_allows_a_burst_then_the_rate():
    limiter = InputRateLimiter(rate=1000, burst=4000)
    assert limiter.allow(4000)
    assert not limiter.allow(500)
    limiter.updated -= 1.0  # a second later
    assert limiter.allow(900)
    assert not limiter.allow(900)


def test_output_window_lags_then_asks_for_a_redraw_once_caught_up():
    window = OutputWindow(window=1000)
    assert window.may_send(600)
    window.record_sent(600)
    assert not window.may_send(600)  # would pass the window: skipped, viewer now lagging
    assert window.lagging_since is not None
    assert not window.may_send(10)
    assert window.acknowledge(300) is False  # 300 in flight: more than a quarter of the window
    assert window.acknowledge(600) is True  # caught up: redraw from scrollback
    assert window.lagging_since is None
    assert window.acknowledge(10_000) is False and window.acked == 600  # cannot acknowledge unsent bytes
    assert window.acknowledge(100) is False and window.acked == 600  # nor go back


# -- recording ------------------------------------------------------------------------------------------------


async def test_recorder_writes_asciicast_v2_and_continues_the_same_file(settings, tmp_path):
    settings.CONSOLE_RECORDINGS_DIR = tmp_path
    first = AsciicastRecorder(attempt_id=5, max_bytes=10_000, flush_seconds=0.05)
    await first.open()
    first.output("héllo ".encode()[:2])  # a UTF-8 sequence split across frames
    first.output("héllo ".encode()[2:])
    first.marker("console connected")
    await first.close()
    second = AsciicastRecorder(attempt_id=5, max_bytes=10_000, flush_seconds=0.05)
    await second.open()
    second.output(b"again\r\n")
    await second.close()
    lines = recording_path(attempt_id=5).read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2 and (header["width"], header["height"]) == (80, 24)
    events = [json.loads(line) for line in lines[1:]]
    assert "".join(text for _, kind, text in events if kind == "o") == "héllo again\r\n"
    assert [kind for _, kind, _ in events].count("m") == 1
    assert sum(1 for line in lines if line.startswith("{")) == 1  # one header: the second session appended


async def test_recorder_stops_at_its_size_cap_with_a_marker(settings, tmp_path):
    settings.CONSOLE_RECORDINGS_DIR = tmp_path
    recorder = AsciicastRecorder(attempt_id=6, max_bytes=600, flush_seconds=10)
    await recorder.open()
    for _ in range(50):
        recorder.output(b"0123456789" * 3)
    await recorder.close()
    text = recording_path(attempt_id=6).read_text()
    assert len(text.encode()) < 800
    assert "recording truncated" in text.splitlines()[-1]


# -- fan-out --------------------------------------------------------------------------------------------------


async def test_fanout_publishes_in_order_with_scrollback_offsets_and_batches_a_backlog():
    layer = InMemoryChannelLayer()
    viewer = await layer.new_channel()
    await layer.group_add("console-900", viewer)
    LocalConsoleState.scrollbacks.pop(900, None)
    state = LocalConsoleState()
    fanout = OutputFanout(
        attempt_id=900,
        state=state,
        channel_layer=layer,
        group="console-900",
        origin="holder",
        start_end=0,
        others=True,
    )
    chunks = [f"{i:04d}".encode() for i in range(40)]
    for chunk in chunks:
        assert fanout.claim(len(chunk)) == fanout.end
        await fanout.put(chunk)
    await fanout.close()
    received, last_end = b"", 0
    while True:
        try:
            message = await asyncio.wait_for(layer.receive(viewer), 0.2)
        except TimeoutError:
            break
        assert message["end"] == last_end + len(message["data"]) and message["origin"] == "holder"
        received, last_end = received + message["data"], message["end"]
    assert received == b"".join(chunks) and last_end == 160
    assert (await state.scrollback_snapshot(attempt_id=900)).end == 160


async def test_a_flush_asked_for_as_the_fanout_closes_returns():
    """A newcomer's announcement reaches a holder handing over: its flush must not wait for a fan-out that will
    publish nothing more (the scrollback here never answers, as Redis under a network fault)."""

    class SilentScrollback(LocalConsoleState):
        async def scrollback_append(self, *, attempt_id: int, data: bytes) -> int:
            await asyncio.sleep(60)
            return 0

    fanout = OutputFanout(
        attempt_id=904,
        state=SilentScrollback(),
        channel_layer=InMemoryChannelLayer(),
        group="console-904",
        origin="holder",
        start_end=0,
        others=True,
    )
    fanout.claim(5)
    await fanout.put(b"hello")
    await fanout.close(within=0.1)
    await asyncio.wait_for(fanout.flush(), 2)


async def test_a_holder_alone_keeps_the_scrollback_but_publishes_nothing_until_a_viewer_joins():
    layer = InMemoryChannelLayer()
    listener = await layer.new_channel()
    await layer.group_add("console-901", listener)  # in the group, but not registered as watching
    LocalConsoleState.scrollbacks.pop(901, None)
    state = LocalConsoleState()
    fanout = OutputFanout(
        attempt_id=901,
        state=state,
        channel_layer=layer,
        group="console-901",
        origin="holder",
        start_end=0,
        others=False,
    )
    await fanout.put(b"alone")
    await fanout.flush()
    assert (await state.scrollback_snapshot(attempt_id=901)).end == 5
    assert fanout.published_end == 5
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(listener), 0.2)
    fanout.viewer_joined()
    await fanout.put(b"shared")
    await fanout.flush()
    message = await asyncio.wait_for(layer.receive(listener), 1)
    assert message["data"] == b"shared" and message["end"] == 11
    await fanout.close()


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_viewer_registry_sees_others_until_they_leave_or_expire(backend, monkeypatch):
    if backend == "redis":
        client = shared_redis()
        await clear_console_keys(client)
        state = RedisConsoleState(client)
    else:
        LocalConsoleState.viewers.pop(902, None)
        state = LocalConsoleState()
    assert await state.viewer_add(attempt_id=902, viewer="a") is False  # registering says whether others watch
    assert not await state.viewers_others(attempt_id=902, viewer="a")
    assert await state.viewer_add(attempt_id=902, viewer="b") is True
    assert await state.viewers_others(attempt_id=902, viewer="a")
    assert await state.viewer_add(attempt_id=902, viewer="a") is True  # a refresh sees them too
    await state.viewer_remove(attempt_id=902, viewer="b")
    assert not await state.viewers_others(attempt_id=902, viewer="a")
    monkeypatch.setattr("labs.console.state.VIEWER_TTL_SECONDS", -1.0)  # "c" registers already expired
    await state.viewer_add(attempt_id=902, viewer="c")
    assert not await state.viewers_others(attempt_id=902, viewer="a")


def test_fanout_ignores_a_look_at_the_viewers_older_than_the_last_newcomer():
    async def scenario():
        layer = InMemoryChannelLayer()
        fanout = OutputFanout(
            attempt_id=903,
            state=LocalConsoleState(),
            channel_layer=layer,
            group="console-903",
            origin="holder",
            start_end=0,
            others=False,
        )
        looked_at = time.monotonic()
        fanout.viewer_joined()
        fanout.observe_others(False, looked_at)  # a beat that started before the newcomer registered
        assert fanout.others
        fanout.observe_others(False, time.monotonic())  # a later one: the newcomer has gone again
        assert not fanout.others
        await fanout.close()

    asyncio.run(scenario())


# -- one process, many consoles: shared Redis connections --------------------------------------------------------


async def test_hundreds_of_simultaneous_console_commands_wait_for_a_connection_instead_of_failing(settings):
    settings.CONSOLE_REDIS_MAX_CONNECTIONS = 8
    client = shared_redis()
    await clear_console_keys(client)
    # redis-py's default pool refuses the 101st simultaneous command (MaxConnectionsError): a daphne with 200
    # consoles lost scrollback appends and lease renewals that way.
    counter = f"{settings.REDIS_KEY_PREFIX}portal:console:test-counter"
    results = await asyncio.gather(*(client.incr(counter) for _ in range(300)))
    assert sorted(results) == list(range(1, 301))
    pool = client.connection_pool
    assert len(pool._available_connections) + len(pool._in_use_connections) <= 8
    await clear_console_keys(client)


async def test_recordings_of_many_consoles_are_written_in_one_worker_thread_call(settings, tmp_path, monkeypatch):
    settings.CONSOLE_RECORDINGS_DIR = tmp_path
    batches = []
    original = recording._append_all

    def counting(writes):
        batches.append(len(writes))
        return original(writes)

    monkeypatch.setattr(recording, "_append_all", counting)
    recorders = [AsciicastRecorder(attempt_id=700 + i, max_bytes=10_000, flush_seconds=0.2) for i in range(20)]
    for recorder in recorders:
        await recorder.open()
    for index, recorder in enumerate(recorders):
        recorder.output(f"console {index}\r\n".encode())
    deadline = time.monotonic() + 10  # one or two flush intervals of 0.2 s, or more on a loaded host
    while sum(batches) < 20:
        assert time.monotonic() < deadline, batches
        await asyncio.sleep(0.05)
    assert batches[0] == 20 and sum(batches) == 20
    for recorder in recorders:
        await recorder.close()
    for index in range(20):
        text = recording_path(attempt_id=700 + index).read_text()
        assert f"console {index}" in text and text.count("console") == 1
    assert recorders[0].writer.task is None  # the last one closed: nothing left running


# -- waiting for the VMI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "phase", "stage"),
    [
        ("requested", "", "waiting"),
        ("provisioning", "", "waiting"),
        ("starting", "Scheduling", "waiting"),
        ("starting", "Scheduled", "waiting"),
        ("starting", "Running", "ready"),  # the VMI runs; the agent has not answered yet
        ("running", "Running", "ready"),
        ("running", "", "ready"),  # the agent answered before any list showed the phase
        ("stopping", "Running", "ended"),
        ("failed", "", "ended"),
        ("expired", "Running", "ended"),
    ],
)
def test_console_dials_only_once_the_vmi_runs(state, phase, stage):
    assert console_stage(state=state, phase=phase) == stage


async def test_an_update_during_the_lookup_is_not_lost(settings):
    """The update that makes the console ready may land while the previous lookup is still running: it must
    wake the wait that follows, not be cleared by it (which left the console waiting for the 5 s fallback)."""
    settings.CONSOLE_UPSTREAM_RETRY_SECONDS = 4.0  # the fallback: 20 s, twice this test's bound
    changed = asyncio.Event()
    lookups: list[float] = []

    async def locate() -> ConsoleLocation:
        lookups.append(time.monotonic())
        if len(lookups) == 1:
            changed.set()  # the VMI came up while this lookup read the older row
            return ConsoleLocation()
        return ConsoleLocation(ended=True)

    states: list[UpstreamState] = []

    async def on_state(state: UpstreamState, detail: str) -> None:
        states.append(state)

    async def on_output(data: bytes) -> None:
        raise AssertionError("nothing is dialled here")

    upstream = ConsoleUpstream(locate=locate, on_output=on_output, on_state=on_state, attempt_changed=changed)
    task = asyncio.create_task(upstream.run())
    try:
        for _ in range(1000):  # 10 s at least
            if len(lookups) >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # At once, or on a loaded host within seconds: half the fallback's 20 s.
    assert len(lookups) >= 2 and lookups[1] - lookups[0] < 10
    assert states[:2] == [UpstreamState.WAITING, UpstreamState.ENDED]


async def test_a_waiting_console_wakes_only_for_updates_that_can_change_its_answer():
    consumer = AttemptConsoleConsumer()
    consumer.attempt_changed = asyncio.Event()
    consumer.upstream = ConsoleUpstream(
        locate=None, on_output=None, on_state=None, attempt_changed=consumer.attempt_changed
    )
    consumer.upstream.state = UpstreamState.WAITING

    async def woken_by(attempt: dict) -> bool:
        consumer.attempt_changed.clear()
        await consumer.attempt_update({"type": "attempt.update", "attempt": attempt})
        return consumer.attempt_changed.is_set()

    assert not await woken_by({"id": 1, "state": "provisioning", "phase": ""})
    assert not await woken_by({"id": 1, "state": "starting", "phase": "Scheduled"})
    assert await woken_by({"id": 1, "state": "starting", "phase": "Running"})
    assert await woken_by({"id": 1, "state": "stopping", "phase": "Scheduled"})
    consumer.upstream.state = UpstreamState.CONNECTED  # not waiting: every update wakes it, as before
    assert await woken_by({"id": 1, "state": "starting", "phase": "Scheduled"})
