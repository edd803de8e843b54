"""The console bridge's parts on their own: lease, scrollback offsets, flow control, recording, fan-out, and the
process-wide parts that let one daphne serve hundreds of consoles (heartbeat, batched appends and writes)."""

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
from labs.console.heartbeat import ConsoleHeartbeat
from labs.console.lease import LocalConsoleLease, RedisConsoleLease
from labs.console.limits import console_limits
from labs.console.recording import AsciicastRecorder, recording_path
from labs.console.redis_client import shared_redis
from labs.console.scrollback import LocalScrollback, RedisScrollback, tail_for_replay
from labs.console.stage import console_stage
from labs.console.upstream import ConsoleLocation, ConsoleUpstream, UpstreamState
from labs.console.viewers import LocalConsoleViewers, RedisConsoleViewers
from labs.consumers.console import AttemptConsoleConsumer


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
        lease = RedisConsoleLease(client)
    else:
        lease = LocalConsoleLease()
    attempt_id = 424242
    assert await lease.acquire(attempt_id=attempt_id, holder="tab-1", ttl=0.5)
    assert not await lease.acquire(attempt_id=attempt_id, holder="tab-2", ttl=0.5)
    assert await lease.holder(attempt_id=attempt_id) == "tab-1"
    assert not await lease.renew(attempt_id=attempt_id, holder="tab-2", ttl=0.5)
    await lease.release(attempt_id=attempt_id, holder="tab-2")  # not the holder: nothing happens
    assert await lease.holder(attempt_id=attempt_id) == "tab-1"
    assert await lease.renew(attempt_id=attempt_id, holder="tab-1", ttl=0.5)
    await lease.release(attempt_id=attempt_id, holder="tab-1")
    assert await lease.acquire(attempt_id=attempt_id, holder="tab-2", ttl=0.3)
    await asyncio.sleep(0.5)  # tab-2's process died: it stops renewing and the lease runs out
    assert await lease.holder(attempt_id=attempt_id) is None
    assert await lease.acquire(attempt_id=attempt_id, holder="tab-3", ttl=0.5)
    # tab-3's first answer was lost (its call cancelled or failed after Redis did the work): asking again is fine.
    assert await lease.acquire(attempt_id=attempt_id, holder="tab-3", ttl=0.5)
    assert not await lease.acquire(attempt_id=attempt_id, holder="tab-4", ttl=0.5)
    await lease.release(attempt_id=attempt_id, holder="tab-3")


# -- scrollback -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_scrollback_keeps_the_tail_and_a_running_offset(backend, settings):
    if backend == "redis":
        client = shared_redis()
        await clear_console_keys(client)
        scrollback = RedisScrollback(client, limit=100)
    else:
        LocalScrollback._buffers.pop(777, None)
        scrollback = LocalScrollback(limit=100)
    assert (await scrollback.snapshot(attempt_id=777)).end == 0
    ends = [await scrollback.append(attempt_id=777, data=f"line {i:03d}\n".encode()) for i in range(50)]
    assert ends == [9 * (i + 1) for i in range(50)]
    snapshot = await scrollback.snapshot(attempt_id=777)
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
    assert window.lagging_since is not None and window.skipped == 600
    assert not window.may_send(10)
    assert window.acknowledge(300) is False  # 300 in flight: more than a quarter of the window
    assert window.acknowledge(600) is True  # caught up: redraw from scrollback
    assert window.lagging_since is None and window.skipped == 0
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
    LocalScrollback._buffers.pop(900, None)
    scrollback = LocalScrollback(limit=1 << 20)
    fanout = OutputFanout(
        attempt_id=900,
        scrollback=scrollback,
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
    assert (await scrollback.snapshot(attempt_id=900)).end == 160


async def test_a_flush_asked_for_as_the_fanout_closes_returns():
    """A newcomer's announcement reaches a holder handing over: its flush must not wait for a fan-out that will
    publish nothing more (the scrollback here never answers, as Redis under a network fault)."""

    class SilentScrollback(LocalScrollback):
        async def append(self, *, attempt_id: int, data: bytes) -> int:
            await asyncio.sleep(60)
            return 0

    fanout = OutputFanout(
        attempt_id=904,
        scrollback=SilentScrollback(limit=1024),
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
    LocalScrollback._buffers.pop(901, None)
    scrollback = LocalScrollback(limit=1 << 20)
    fanout = OutputFanout(
        attempt_id=901,
        scrollback=scrollback,
        channel_layer=layer,
        group="console-901",
        origin="holder",
        start_end=0,
        others=False,
    )
    await fanout.put(b"alone")
    await fanout.flush()
    assert (await scrollback.snapshot(attempt_id=901)).end == 5
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
        viewers = RedisConsoleViewers(client)
    else:
        LocalConsoleViewers._table.pop(902, None)
        viewers = LocalConsoleViewers()
    assert await viewers.add(attempt_id=902, viewer="a") is False  # registering says whether others watch
    assert not await viewers.others(attempt_id=902, viewer="a")
    assert await viewers.add(attempt_id=902, viewer="b") is True
    assert await viewers.others(attempt_id=902, viewer="a")
    assert await viewers.add(attempt_id=902, viewer="a") is True  # a refresh sees them too
    await viewers.remove(attempt_id=902, viewer="b")
    assert not await viewers.others(attempt_id=902, viewer="a")
    monkeypatch.setattr("labs.console.viewers.VIEWER_TTL_SECONDS", -1.0)  # "c" registers already expired
    await viewers.add(attempt_id=902, viewer="c")
    assert not await viewers.others(attempt_id=902, viewer="a")


def test_fanout_ignores_a_look_at_the_viewers_older_than_the_last_newcomer():
    async def scenario():
        layer = InMemoryChannelLayer()
        fanout = OutputFanout(
            attempt_id=903,
            scrollback=LocalScrollback(limit=1024),
            channel_layer=layer,
            group="console-903",
            origin="holder",
            start_end=0,
            others=False,
        )
        looked_at = time.monotonic()
        fanout.viewer_joined()
        fanout.observe_others(False, looked_at)  # a heartbeat that started before the newcomer registered
        assert fanout.others
        fanout.observe_others(False, time.monotonic())  # a later one: the newcomer has gone again
        assert not fanout.others
        await fanout.close()

    asyncio.run(scenario())


# -- one process, many consoles: shared Redis connections, one round trip per beat -------------------------------


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


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_heartbeat_renews_registers_and_reports_in_one_beat(backend, settings, monkeypatch):
    if backend == "redis":
        client = shared_redis()
        await clear_console_keys(client)
        lease, viewers = RedisConsoleLease(client), RedisConsoleViewers(client)
        heartbeat = ConsoleHeartbeat(client=client, ttl=0.6)
    else:
        LocalConsoleLease._table.clear()
        LocalConsoleViewers._table.clear()
        lease, viewers = LocalConsoleLease(), LocalConsoleViewers()
        heartbeat = ConsoleHeartbeat(client=None, ttl=0.6)
    monkeypatch.setattr(heartbeat, "_run", lambda: asyncio.sleep(3600))  # beats driven by hand below
    lost, seen = [], []
    for attempt_id in (910, 911, 912):
        assert await lease.acquire(attempt_id=attempt_id, holder=f"holder-{attempt_id}", ttl=0.6)
    held = {
        attempt_id: heartbeat.hold(
            attempt_id=attempt_id,
            holder=f"holder-{attempt_id}",
            on_lost=lambda a=attempt_id: lost.append(a),
            on_others=lambda others, as_of, a=attempt_id: seen.append((a, others)),
        )
        for attempt_id in (910, 911, 912)
    }
    await viewers.add(attempt_id=910, viewer="holder-910")
    heartbeat.watch(attempt_id=910, viewer="holder-910")
    heartbeat.watch(attempt_id=910, viewer="tab-2")  # another tab of 910 in this process
    for _ in range(3):  # three lease lifetimes: kept alive by the beats alone
        await asyncio.sleep(0.3)
        await heartbeat.beat()
    assert await lease.holder(attempt_id=910) == "holder-910"
    assert (910, True) in seen and (911, False) in seen and lost == []

    # 911's lease expires unrenewed and nobody takes it: taken again. 912's is taken by somebody else: lost.
    await lease.release(attempt_id=911, holder="holder-911")
    await lease.release(attempt_id=912, holder="holder-912")
    assert await lease.acquire(attempt_id=912, holder="elsewhere", ttl=5)
    await heartbeat.beat()
    assert await lease.holder(attempt_id=911) == "holder-911"
    assert await lease.holder(attempt_id=912) == "elsewhere"
    assert lost == [912] and held[912].lost and not held[911].lost
    seen.clear()
    await heartbeat.beat()
    assert {a for a, _ in seen} == {910, 911}  # a lost lease is no longer renewed nor reported

    heartbeat.unwatch(attempt_id=910, viewer="tab-2")
    await viewers.remove(attempt_id=910, viewer="tab-2")
    seen.clear()
    await heartbeat.beat()
    assert (910, False) in seen
    for attempt_id in (910, 911):
        heartbeat.release(held[attempt_id])
    heartbeat.unwatch(attempt_id=910, viewer="holder-910")
    assert heartbeat.task is None


async def test_appends_asked_for_together_go_to_redis_in_one_call(settings):
    client = shared_redis()
    await clear_console_keys(client)
    scrollbacks = [RedisScrollback(client, limit=100) for _ in range(50)]
    calls = []
    appends = scrollbacks[0].appends
    script = appends.script

    async def counting(**kwargs):
        calls.append(len(kwargs["keys"]) // 2)
        return await script(**kwargs)

    appends.script = counting
    try:
        ends = await asyncio.gather(
            *(sb.append(attempt_id=1000 + i, data=b"x" * (i + 1)) for i, sb in enumerate(scrollbacks))
        )
        assert ends == [i + 1 for i in range(50)]
        assert calls == [50]
        again = await scrollbacks[3].append(attempt_id=1003, data=b"yz")
        assert again == 6 and calls == [50, 1]
        snapshot = await scrollbacks[3].snapshot(attempt_id=1003)
        assert snapshot.data == b"xxxxyz" and snapshot.end == 6
    finally:
        appends.script = script
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
    await asyncio.sleep(0.5)  # one or two intervals
    assert batches and batches[0] == 20 and sum(batches) == 20
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
    settings.CONSOLE_UPSTREAM_RETRY_SECONDS = 4.0  # the fallback: 20 s, far past this test's bound
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

    upstream = ConsoleUpstream(
        locate=locate, on_output=on_output, on_state=on_state, attempt_changed=changed, limits=console_limits()
    )
    task = asyncio.create_task(upstream.run())
    try:
        for _ in range(100):
            if len(lookups) >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(lookups) >= 2 and lookups[1] - lookups[0] < 1.0
    assert states[:2] == [UpstreamState.WAITING, UpstreamState.ENDED]


async def test_a_waiting_console_wakes_only_for_updates_that_can_change_its_answer():
    consumer = AttemptConsoleConsumer()
    consumer.attempt_changed = asyncio.Event()
    consumer.upstream = ConsoleUpstream(
        locate=None, on_output=None, on_state=None, attempt_changed=consumer.attempt_changed, limits=console_limits()
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
