"""Console churn (DESIGN §9): rounds of sockets on one attempt's console opening and closing at random moments.

Each round opens ``--sockets`` sockets over about a second, spread over the daphne processes (two on Redis by
default; ``--layer memory`` runs the embedded default's one daphne on the in-memory layer). Each closes at a moment
drawn in turn from: during the handshake, at ``hello``, between ``hello`` and ``status``, after ``status``, after
typing. After every round a new socket must get a ``status`` within 2 s and the echo of what it types; then, with
every socket closed, the lease must be handed back and nobody registered (Redis), and kubesim must have no console
open (and again after the run's quiet pause). Prints one JSON object: rounds, sockets per round, each daphne's RSS
before the run and after each round (and after a quiet pause at the end), time to first ``status`` (p50/p99) of the
round sockets that waited for it and of the checks (and to ``hello``, for comparison: the handshakes of a whole
round queue on the same processes), and failures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    BENCH_VAR,
    bench_database_url,
    bench_redis_url,
    emit,
    kubesim,
    log,
    machine,
    seed_course,
    session_cookie,
    setup_django,
    summary_ms,
)

MOMENTS = ("during_handshake", "at_hello", "before_status", "after_status", "after_typing")
STATUS_WITHIN_SECONDS = 2.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def redis_console_state(attempt_id: int) -> tuple[str | None, list[str]]:
    import redis

    prefix = os.environ.get("REDIS_KEY_PREFIX", "")
    client = redis.Redis.from_url(bench_redis_url(), decode_responses=True)
    try:
        return (
            client.get(f"{prefix}portal:console:lease:{attempt_id}"),
            client.zrangebyscore(f"{prefix}portal:console:viewers:{attempt_id}", time.time(), "+inf"),
        )
    finally:
        client.close()


async def first_status(socket: aiohttp.ClientWebSocketResponse, *, wanted: str = "status") -> None:
    async for message in socket:
        if message.type == aiohttp.WSMsgType.TEXT and json.loads(message.data)["type"] == wanted:
            return
    raise ConnectionError("closed before a status")


async def churning_socket(
    session, url: str, headers: dict, moment: str, rng: random.Random, times: dict[str, list[float]], failures: Counter
) -> None:
    await asyncio.sleep(rng.uniform(0, 1.0))
    try:
        if moment == "during_handshake":
            opening = asyncio.ensure_future(session.ws_connect(url, headers=headers))
            await asyncio.sleep(rng.uniform(0, 0.05))
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await (await opening).close()
            return
        started = time.monotonic()
        socket = await session.ws_connect(url, headers=headers)
        async with asyncio.timeout(30):
            await first_status(socket, wanted="hello")
            times["hello"].append(time.monotonic() - started)
            if moment == "before_status":
                await asyncio.sleep(rng.uniform(0, 0.05))
            elif moment != "at_hello":
                await first_status(socket)
                times["status"].append(time.monotonic() - started)
                if moment == "after_typing":
                    await socket.send_bytes(b"echo churn\r")
                await asyncio.sleep(rng.uniform(0, 0.3))
        await socket.close()
    except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
        failures[f"{moment}: {type(exc).__name__}"] += 1


async def check(session, url: str, headers: dict, word: str) -> dict[str, Any]:
    """A new socket: seconds to its first status, whether its echo came back, the lease as Redis saw it."""
    started = time.monotonic()
    outcome: dict[str, Any] = {"status_s": None, "echo": False}
    socket = await session.ws_connect(url, headers=headers)
    try:
        async with asyncio.timeout(20):
            statuses, output = [], bytearray()
            while "connected" not in statuses:
                message = await socket.receive()
                if message.type == aiohttp.WSMsgType.TEXT and json.loads(message.data)["type"] == "status":
                    statuses.append(json.loads(message.data)["state"])
                    if outcome["status_s"] is None:
                        outcome["status_s"] = round(time.monotonic() - started, 3)
            await socket.send_bytes(f"echo {word}-$((7*6))\r".encode())
            while f"{word}-42".encode() not in output:
                message = await socket.receive()
                if message.type == aiohttp.WSMsgType.BINARY:
                    output += message.data
            outcome["echo"] = True
    except TimeoutError:
        pass
    finally:
        await socket.close()
    return outcome


async def settled(cluster, attempt_id: int, *, redis: bool, within: float = 10.0) -> bool:
    """Everything handed back once every socket has closed: no console upstream, no lease, nobody registered."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        consoles = (await asyncio.to_thread(cluster.admin.counters))["open_consoles"]
        state = await asyncio.to_thread(redis_console_state, attempt_id) if redis else (None, [])
        if consoles == 0 and state == (None, []):
            return True
        await asyncio.sleep(0.2)
    return False


async def churn(args, portals, attempt_id: int, cookie: str, cluster) -> dict[str, Any]:
    rng = random.Random(args.seed)
    pids = [portal.processes[0][1].pid for portal in portals]
    urls = [f"ws://127.0.0.1:{p.port}/ws/attempts/{attempt_id}/console/" for p in portals]
    headers = [{"Cookie": cookie, "Origin": p.url} for p in portals]
    rss = {"before": [rss_mb(pid) for pid in pids], "after_round": []}
    times: dict[str, list[float]] = {"hello": [], "status": []}
    checks: list[dict[str, Any]] = []
    failures: Counter = Counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for number in range(args.rounds):
            sides = [rng.randrange(len(portals)) for _ in range(args.sockets)]
            await asyncio.gather(
                *(
                    churning_socket(session, urls[side], headers[side], MOMENTS[i % len(MOMENTS)], rng, times, failures)
                    for i, side in enumerate(sides)
                )
            )
            side = number % len(portals)
            outcome = await check(session, urls[side], headers[side], f"round{number}")
            outcome["settled"] = await settled(cluster, attempt_id, redis=args.layer == "redis")
            checks.append(outcome)
            rss["after_round"].append([rss_mb(pid) for pid in pids])
            log(f"round {number + 1}: {outcome}, RSS {rss['after_round'][-1]} MB, failures {dict(failures)}")
    await asyncio.sleep(args.pause)
    rss["after_pause"] = [rss_mb(pid) for pid in pids]
    # A round's leavings may outlast its check on a loaded machine; by now they must all be handed back.
    settled_at_end = await settled(cluster, attempt_id, redis=args.layer == "redis", within=30)
    return {
        "rss_mb": rss,
        "times": times,
        "checks": checks,
        "settled_at_end": settled_at_end,
        "failures": dict(failures),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sockets", type=int, default=200, help="sockets per round")
    parser.add_argument(
        "--layer",
        choices=("redis", "memory"),
        default="redis",
        help="redis: two daphne processes; memory: one, the embedded default's layer",
    )
    parser.add_argument("--pause", type=float, default=15.0, help="quiet seconds before the last RSS reading")
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()

    with kubesim(name="kubesim-churn", nodes=2) as server:
        setup_django(KUBECONFIG=str(server.kubeconfig))
        from labs.kubevirt import client as kube_client
        from tests.browser.attempts import running_attempt
        from tests.browser.live import LivePortal

        kube_client.reset()
        seeded = seed_course(students=1, labs=1, checks_per_lab=1)
        attempt = running_attempt(student=seeded.students[0], lab=seeded.labs[0])
        from django.conf import settings

        cookie = f"{settings.SESSION_COOKIE_NAME}={session_cookie(seeded.students[0])}"
        count = 2 if args.layer == "redis" else 1
        redis_url = bench_redis_url() if args.layer == "redis" else ""
        portals = [
            LivePortal(
                database_url=bench_database_url(),
                redis_url=redis_url,
                kubeconfig=server.kubeconfig,
                workdir=BENCH_VAR / "logs" / f"churn-{args.layer}-{n}",
                worker=False,
                extra_env={"LOG_LEVEL": "WARNING"},
            )
            for n in range(count)
        ]
        try:
            for portal in portals:
                portal.start()
            log(f"{count} daphne process(es) on the {args.layer} layer; {args.rounds} rounds of {args.sockets}")
            result = asyncio.run(churn(args, portals, attempt.id, cookie, server))
        finally:
            for portal in portals:
                portal.stop()
    times = result.pop("times")
    checks = result["checks"]
    emit(
        {
            "benchmark": "console_churn",
            "machine": machine(),
            "layer": args.layer,
            "daphne_processes": count,
            "rounds": args.rounds,
            "sockets_per_round": args.sockets,
            "time_to_hello_round_sockets": summary_ms(times["hello"]),
            "time_to_status_round_sockets": summary_ms(times["status"]),
            "time_to_status_checks": summary_ms([c["status_s"] for c in checks if c["status_s"] is not None]),
            "checks_meeting_target": sum(
                1
                for c in checks
                if c["echo"] and c["settled"] and c["status_s"] is not None and c["status_s"] <= STATUS_WITHIN_SECONDS
            ),
            **result,
        }
    )


if __name__ == "__main__":
    main()
