"""One upstream console per attempt across portal processes: two daphnes on one Redis, a tab on each."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import Client

from tests.browser.attempts import running_attempt
from tests.browser.live import LivePortal, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CONSOLE_RESOURCE = "virtualmachineinstances/console"


@pytest.fixture
def attempt(cluster, student_a, lab_a):
    return running_attempt(student=student_a, lab=lab_a)


@pytest.fixture
def two_portals(attempt, kubesim_server, tmp_path):
    if not settings.REDIS_URL:
        pytest.fail("Several portal processes share state through Redis: set REDIS_URL.")
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}portal:console:*"))
    if keys:
        client.delete(*keys)
    client.close()
    portals = [
        LivePortal(
            database_url=subprocess_database_url(),
            redis_url=settings.REDIS_URL,
            kubeconfig=kubesim_server.kubeconfig,
            workdir=tmp_path / f"portal-{n}",
            worker=False,
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


def cookie_for(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


class Tab:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.output = bytearray()
        self.statuses: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            if message.type == aiohttp.WSMsgType.BINARY:
                self.output += message.data
                await self.socket.send_str(json.dumps({"type": "ack", "bytes": len(self.output)}))
            elif message.type == aiohttp.WSMsgType.TEXT:
                control = json.loads(message.data)
                if control["type"] == "status":
                    self.statuses.append(control["state"])

    async def until(self, predicate, *, within: float = 20.0) -> None:
        deadline = time.monotonic() + within
        while not predicate(self):
            assert time.monotonic() < deadline, f"statuses={self.statuses} output={bytes(self.output[-300:])!r}"
            assert not self.reader.done(), "socket closed"
            await asyncio.sleep(0.05)


async def open_tab(session, portal, attempt_id: int, cookie: str) -> Tab:
    socket = await session.ws_connect(
        f"ws://127.0.0.1:{portal.port}/ws/attempts/{attempt_id}/console/",
        headers={"Cookie": cookie, "Origin": portal.url},
    )
    return Tab(socket)


async def test_tabs_on_two_processes_share_one_upstream_and_hand_it_over(two_portals, attempt, cluster, student_a):
    cookie = await sync_to_async(cookie_for)(student_a)
    first_portal, second_portal = two_portals
    before = (await sync_to_async(cluster.admin.counters)())["by_resource"].get(CONSOLE_RESOURCE, 0)
    async with aiohttp.ClientSession() as session:
        first = await open_tab(session, first_portal, attempt.id, cookie)
        await first.until(lambda t: "connected" in t.statuses)
        second = await open_tab(session, second_portal, attempt.id, cookie)
        await second.until(lambda t: "connected" in t.statuses)

        await second.socket.send_bytes(b"echo across-$((100+1))\r")
        for tab in (first, second):
            await tab.until(lambda t: b"across-101" in t.output)
        await asyncio.sleep(1.0)
        counters = await sync_to_async(cluster.admin.counters)()
        # One console request for both processes, and nobody was kicked off (KubeVirt keeps one client per VMI).
        assert counters["by_resource"][CONSOLE_RESOURCE] == before + 1
        assert counters["open_consoles"] == 1
        assert "lost" not in first.statuses and "lost" not in second.statuses

        # The holder's process loses its tab: the other process takes the upstream over.
        await first.socket.close()
        await second.until(lambda t: t.statuses.count("connected") >= 1 and "connecting" in t.statuses)
        await second.until(lambda t: t.statuses[-1] == "connected")
        await second.socket.send_bytes(b"echo taken-over-$((100+2))\r")
        await second.until(lambda t: b"taken-over-102" in t.output)
        assert (await sync_to_async(cluster.admin.counters)())["open_consoles"] == 1
        await second.socket.close()
