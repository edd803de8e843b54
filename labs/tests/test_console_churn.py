"""The console under churn: rounds of sockets opening and closing at random moments, on both channel layers and
across two daphne processes; after every round a new socket gets ``status`` within seconds, its input reaches the
guest, nothing of the gone sockets is left and memory stays within 40 MB of the first round's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings

from labs.console.state import LocalConsoleState, console_key, console_state
from labs.consumers.console import console_group, console_input_group
from labs.consumers.events import attempt_group
from labs.tests import console_lease_settings
from labs.tests.test_console_handover import console_tasks
from labs.tests.test_consumers import (  # noqa: F401 - the autouse fixtures apply here too
    HOST,
    ORIGIN,
    fast_password_hasher,
    isolated_console_state,
    open_console,
    open_consoles,
    session_cookie,
    wait_for,
)
from ops.asgi import application
from tests.browser.attempts import running_attempt
from tests.browser.live import LivePortal, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

ROUNDS = 3
SOCKETS_PER_ROUND = 16
# The console lease lasts 24 s here: a lease a gone socket kept would hold a new socket's status back for most of
# that, and a viewer waiting for the lease asks the holder again only every 8 s. A new socket that finds the lease
# free has its status at once.
LEASE_TTL_SECONDS = console_lease_settings.CONSOLE_LEASE_TTL_SECONDS
STATUS_WITHIN_SECONDS = 6.0
# Long enough for consumers still leaving when their sockets' close returned; short of the lease running out.
LEFT_BEHIND_WITHIN_SECONDS = 12.0
# What a daphne may keep after the first round (its caches, pools and arenas warm by then).
RSS_BOUND_MB = 40
MOMENTS = ("during_handshake", "at_hello", "before_status", "after_status", "after_typing")


@pytest.fixture(autouse=True)
def long_console_lease(settings):
    settings.CONSOLE_LEASE_TTL_SECONDS = LEASE_TTL_SECONDS


@pytest.fixture
def attempt(cluster, student_a, lab_a):
    return running_attempt(student=student_a, lab=lab_a)


@pytest.fixture(params=["memory", "redis"])
def channel_layer_kind(request, settings):
    if request.param == "memory":
        settings.REDIS_URL = None
        settings.CHANNEL_LAYERS = {
            "default": {"BACKEND": "portal.channel_layer.InMemoryChannelLayer", "CONFIG": {"capacity": 1500}}
        }
    elif not settings.REDIS_URL:
        pytest.fail("The Redis channel layer needs REDIS_URL.")
    return request.param


async def churning_socket(path: str, cookie: bytes, moment: str, rng: random.Random) -> None:
    """One tab that closes at ``moment``, a random fraction of a second into it."""
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, (b"cookie", cookie)])
    await asyncio.sleep(rng.uniform(0, 0.3))
    if moment == "during_handshake":
        await communicator.send_input({"type": "websocket.connect"})
        await asyncio.sleep(rng.uniform(0, 0.05))
    else:
        connected, code = await communicator.connect(timeout=10)
        assert connected, code
        seen: list[dict] = []

        async def read_until(kind: str) -> None:
            while not any(m.get("type") == kind for m in seen):
                try:
                    frame = await asyncio.wait_for(communicator.output_queue.get(), 10)
                except TimeoutError:
                    raise AssertionError(f"a socket to close {moment} saw no {kind} within 10 s: {seen}") from None
                if frame.get("text"):
                    seen.append(json.loads(frame["text"]))

        if moment in ("at_hello", "before_status"):
            await read_until("hello")
            await asyncio.sleep(rng.uniform(0, 0.05) if moment == "before_status" else 0)
        else:
            await read_until("status")
            if moment == "after_typing":
                await communicator.send_to(bytes_data=b"echo churn\r")
            await asyncio.sleep(rng.uniform(0, 0.2))
    await communicator.send_input({"type": "websocket.disconnect", "code": 1001})
    try:
        # A consumer that loses its cancellation never ends; a loaded host ends one within seconds.
        await asyncio.wait_for(asyncio.shield(communicator.future), 15)
    except TimeoutError:
        communicator.future.cancel()
        raise AssertionError(f"a socket closed {moment} did not end its consumer") from None


async def check_a_new_socket(student, attempt_id: int, word: str) -> None:
    """A new socket has a status within seconds, its input reaches the guest, and the lease is its own."""
    started = time.monotonic()
    viewer = await open_console(student, attempt_id)
    await viewer.read_until(lambda v: v.statuses(), within=STATUS_WITHIN_SECONDS - (time.monotonic() - started))
    await viewer.read_until(lambda v: "connected" in v.statuses(), within=10)
    await viewer.type(f"echo {word}-$((7*6))\r".encode())
    await viewer.read_until(lambda v: v.has_output(f"{word}-42".encode()), within=10)
    live = await registered(attempt_id)
    assert len(live) == 1, "a gone socket is still registered as watching"
    assert await console_state().get("lease", attempt_id) in live
    await viewer.close()


async def registered(attempt_id: int) -> set[str]:
    """The viewers registered as watching the attempt's console and not removed since, lapsed or not: only a
    viewer's leaving removes it, so a gone socket's registration stays here however long the test takes."""
    state = console_state()
    if isinstance(state, LocalConsoleState):
        return set(state.viewers.get(attempt_id, {}))
    return {member.decode() for member in await state.client.zrange(console_key("viewers", attempt_id), 0, -1)}


async def left_behind(attempt_id: int, cluster) -> list[str]:
    """What the gone sockets still hold: nothing, once every consumer has finished leaving."""
    left = []
    if await sync_to_async(open_consoles)(cluster):
        left.append("the upstream")
    if viewers := await registered(attempt_id):
        left.append(f"registrations {viewers}")
    if await console_state().get("lease", attempt_id) is not None:
        left.append("the lease")
    if tasks := console_tasks(attempt_id):
        left.append(f"tasks {tasks}")
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # the in-memory layer: nothing kept for the gone consumers
        for group in (console_group(attempt_id), console_input_group(attempt_id), attempt_group(attempt_id)):
            if layer.groups.get(group):
                left.append(f"members of {group}")
        if layer.channels:
            left.append(f"{len(layer.channels)} channels")
    return left


async def assert_nothing_left(attempt_id: int, cluster) -> None:
    deadline = time.monotonic() + LEFT_BEHIND_WITHIN_SECONDS
    while left := await left_behind(attempt_id, cluster):
        assert time.monotonic() < deadline, f"gone consumers left behind: {', '.join(left)}"
        await asyncio.sleep(0.1)


async def test_console_survives_rounds_of_sockets_closing_at_random_moments(
    channel_layer_kind, attempt, cluster, student_a
):
    rng = random.Random(31)
    cookie = await sync_to_async(session_cookie)(student_a)
    path = f"/ws/attempts/{attempt.id}/console/"
    for number in range(ROUNDS):
        moments = [MOMENTS[index % len(MOMENTS)] for index in range(SOCKETS_PER_ROUND)]
        await asyncio.gather(*(churning_socket(path, cookie, moment, rng) for moment in moments))
        await check_a_new_socket(student_a, attempt.id, f"round{number}")
        await assert_nothing_left(attempt.id, cluster)


# -- two daphne processes on one Redis --------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def redis_console_state(attempt_id: int) -> tuple[str | None, set[str]]:
    """The lease's holder and the registered viewers (lapsed or not, as ``registered``), as every process sees them."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    try:
        holder = client.get(f"{settings.REDIS_KEY_PREFIX}portal:console:lease:{attempt_id}")
        viewers = set(client.zrange(f"{settings.REDIS_KEY_PREFIX}portal:console:viewers:{attempt_id}", 0, -1))
    finally:
        client.close()
    return holder, viewers


@pytest.fixture
def two_daphnes(attempt, kubesim_server, tmp_path):
    if not settings.REDIS_URL:
        pytest.fail("Several portal processes share state through Redis: set REDIS_URL.")
    portals = [
        LivePortal(
            database_url=subprocess_database_url(),
            redis_url=settings.REDIS_URL,
            kubeconfig=kubesim_server.kubeconfig,
            workdir=tmp_path / f"portal-{n}",
            worker=False,
            extra_env={"DJANGO_SETTINGS_MODULE": console_lease_settings.__name__},
        )
        for n in (1, 2)
    ]
    try:
        for portal in portals:
            portal.start()
        yield portals
    finally:
        for portal in portals:
            portal.stop()


async def churning_client(session, url: str, headers: dict, moment: str, rng: random.Random) -> None:
    await asyncio.sleep(rng.uniform(0, 0.3))
    if moment == "during_handshake":
        opening = asyncio.ensure_future(session.ws_connect(url, headers=headers))
        await asyncio.sleep(rng.uniform(0, 0.05))
        if not opening.done():
            opening.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            socket = await opening
            await socket.close()
        return
    socket = await session.ws_connect(url, headers=headers)
    wanted = "hello" if moment in ("at_hello", "before_status") else "status"
    async for message in socket:
        if message.type == aiohttp.WSMsgType.TEXT and json.loads(message.data)["type"] == wanted:
            break
    if moment == "before_status":
        await asyncio.sleep(rng.uniform(0, 0.05))
    if moment == "after_typing":
        await socket.send_bytes(b"echo churn\r")
        await asyncio.sleep(rng.uniform(0, 0.2))
    await socket.close()


async def check_through(session, url: str, headers: dict, word: str) -> str:
    """A new socket's first status (within seconds), then its echo; returns the holder it saw in Redis."""
    started = time.monotonic()
    socket = await session.ws_connect(url, headers=headers)
    statuses, output = [], bytearray()
    try:
        async with asyncio.timeout(STATUS_WITHIN_SECONDS):
            while not statuses:
                message = await socket.receive()
                if message.type == aiohttp.WSMsgType.TEXT and json.loads(message.data)["type"] == "status":
                    statuses.append(json.loads(message.data)["state"])
        assert time.monotonic() - started < STATUS_WITHIN_SECONDS
        async with asyncio.timeout(15):
            while "connected" not in statuses:
                message = await socket.receive()
                if message.type == aiohttp.WSMsgType.TEXT and json.loads(message.data)["type"] == "status":
                    statuses.append(json.loads(message.data)["state"])
            await socket.send_bytes(f"echo {word}-$((7*6))\r".encode())
            while f"{word}-42".encode() not in output:
                message = await socket.receive()
                if message.type == aiohttp.WSMsgType.BINARY:
                    output += message.data
        holder, viewers = await sync_to_async(redis_console_state)(int(url.rstrip("/").split("/")[-2]))
        assert len(viewers) == 1, f"gone sockets still registered: {viewers}"
        assert holder in viewers, "the lease is held by a gone viewer"
    finally:
        await socket.close()
    return holder


async def test_console_survives_churn_across_two_daphne_processes(two_daphnes, attempt, cluster, student_a):
    rng = random.Random(366)
    cookie = (await sync_to_async(session_cookie)(student_a)).decode()
    urls = [f"ws://127.0.0.1:{portal.port}/ws/attempts/{attempt.id}/console/" for portal in two_daphnes]
    headers = [{"Cookie": cookie, "Origin": portal.url} for portal in two_daphnes]
    pids = [portal.processes[0][1].pid for portal in two_daphnes]
    baseline: list[float] = []
    async with aiohttp.ClientSession() as session:
        for number in range(ROUNDS):
            clients = []
            for index in range(SOCKETS_PER_ROUND):
                side = rng.randrange(2)
                clients.append(churning_client(session, urls[side], headers[side], MOMENTS[index % len(MOMENTS)], rng))
            await asyncio.gather(*clients)
            side = number % 2
            await check_through(session, urls[side], headers[side], f"round{number}")
            await wait_for(
                lambda: open_consoles(cluster) == 0, within=LEFT_BEHIND_WITHIN_SECONDS, what="the upstream to close"
            )
            await wait_for(
                lambda: redis_console_state(attempt.id) == (None, set()),
                within=LEFT_BEHIND_WITHIN_SECONDS,
                what="the lease and registrations handed back",
            )
            sizes = [rss_mb(pid) for pid in pids]
            if not baseline:
                baseline = sizes
            for before, after in zip(baseline, sizes, strict=True):
                assert after - before < RSS_BOUND_MB, f"daphne grew from {before:.0f} MB to {after:.0f} MB"
