"""kubesim's own figures, printed as JSON: 500 VMs to Running with zero delays, memory per idle guest, and
keystroke echo latency with 200 concurrent consoles.

    .venv/bin/python -m kubesim.bench_kubesim [--vms 500] [--guests 20] [--consoles 200] [--keystrokes 20]

Each figure runs against a fresh kubesim subprocess (``KubesimServer``), spoken to over HTTP and WebSocket as
the portal does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from kubesim.testing import KubesimServer
from kubesim.tests.support import agent_user_data, secret_manifest, vm_manifest

VMS = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines"
VMIS = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances"
CONSOLE = "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/console"
REAL_AGENT = Path(__file__).resolve().parent.parent / "guest" / "agent.py"


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process: the cost of the work, whatever else the machine is doing."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


async def _create_vms(
    session: aiohttp.ClientSession, url: str, manifests: list[dict[str, Any]], concurrency: int = 16
) -> None:
    queue: asyncio.Queue = asyncio.Queue()
    for manifest in manifests:
        queue.put_nowait(manifest)

    async def worker() -> None:
        while not queue.empty():
            manifest = queue.get_nowait()
            async with session.post(url + VMS.format(ns=manifest["metadata"]["namespace"]), json=manifest) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"create failed: {resp.status} {await resp.text()}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _wait_running(
    session: aiohttp.ClientSession, url: str, namespace: str, count: int, resource_version: str, within: float = 180
) -> float:
    """Watch VMIs from ``resource_version`` until ``count`` are Running; returns when that happened."""
    running: set[str] = set()
    params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(int(within))}
    async with session.get(
        url + VMIS.format(ns=namespace), params=params, timeout=aiohttp.ClientTimeout(total=within)
    ) as resp:
        async for line in resp.content:
            event = json.loads(line)
            obj = event["object"]
            if (obj.get("status") or {}).get("phase") == "Running":
                running.add(obj["metadata"]["name"])
                if len(running) >= count:
                    return time.monotonic()
    raise RuntimeError(f"only {len(running)} of {count} VMIs reached Running")


async def bench_start(vms: int, guest: str) -> dict[str, Any]:
    with KubesimServer(guest=guest, nodes=max(3, vms // 40 + 1)) as sim:  # room for every 1Gi VM
        async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
            async with session.get(sim.url + VMIS.format(ns="default")) as resp:
                rv = (await resp.json())["metadata"]["resourceVersion"]
            manifests = [vm_manifest(f"bench-{i:04d}", memory="1Gi") for i in range(vms)]
            cpu_before = _cpu_seconds(sim.process.pid)
            waiter = asyncio.create_task(_wait_running(session, sim.url, "default", vms, rv))
            started = time.monotonic()
            await _create_vms(session, sim.url, manifests)
            created = time.monotonic()
            all_running = await waiter
            server_cpu = _cpu_seconds(sim.process.pid) - cpu_before
            list_started = time.monotonic()
            async with session.get(sim.url + VMIS.format(ns="default")) as resp:
                items = len((await resp.json())["items"])
            list_seconds = time.monotonic() - list_started
        server_rss = _rss_kib(sim.process.pid) if sim.process else 0
        counters = sim.admin.counters()
    return {
        "vms": vms,
        "guest": guest,
        "create_seconds": round(created - started, 3),
        "all_running_seconds": round(all_running - started, 3),
        "running_after_last_create_seconds": round(all_running - created, 3),
        "server_cpu_seconds": round(server_cpu, 2),
        "server_cpu_ms_per_vm_start": round(server_cpu * 1000 / vms, 2),
        "list_all_vmis_seconds": round(list_seconds, 4),
        "listed": items,
        "server_rss_mib": round(server_rss / 1024, 1),
        "api_requests": counters["total"],
    }


async def _open_console(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(url, protocols=("plain.kubevirt.io",), max_msg_size=0)
    await ws.send_bytes(b"\r")
    await _read_until(ws, b"$ ")
    return ws


async def _read_until(ws: aiohttp.ClientWebSocketResponse, needle: bytes) -> bytes:
    received = b""
    while needle not in received:
        message = await ws.receive()
        if message.type != aiohttp.WSMsgType.BINARY:
            raise RuntimeError(f"console closed: {message.type}")
        received += message.data
    return received


async def _start_and_wait(sim: KubesimServer, session: aiohttp.ClientSession, manifests: list[dict[str, Any]]) -> None:
    async with session.get(sim.url + VMIS.format(ns="default")) as resp:
        rv = (await resp.json())["metadata"]["resourceVersion"]
    waiter = asyncio.create_task(_wait_running(session, sim.url, "default", len(manifests), rv))
    await _create_vms(session, sim.url, manifests)
    await waiter


async def bench_guest_memory(guests: int) -> dict[str, Any]:
    """RSS of an idle guest: its shell (started by a console connection), and with the lab agent running."""
    result: dict[str, Any] = {"guests": guests}
    with KubesimServer(guest="shell") as sim:
        async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
            base_rss = _rss_kib(sim.process.pid)
            with_agent = REAL_AGENT.exists()
            manifests = []
            for i in range(guests):
                name = f"idle-{i:03d}"
                if with_agent:
                    user_data = agent_user_data(token=f"token-{i:04d}-bench-bench", agent_source=REAL_AGENT.read_text())
                    async with session.post(
                        sim.url + "/api/v1/namespaces/default/secrets", json=secret_manifest(f"{name}-ci", user_data)
                    ) as resp:
                        assert resp.status == 201, await resp.text()
                manifests.append(vm_manifest(name, cloud_init_secret=f"{name}-ci" if with_agent else None))
            await _start_and_wait(sim, session, manifests)
            consoles = [
                await _open_console(session, sim.ws_url + CONSOLE.format(ns="default", name=m["metadata"]["name"]))
                for m in manifests
            ]
            deadline = time.monotonic() + 60
            while True:
                described = sim.admin.guests()
                if not with_agent or all(g["ports"].get("8787") for g in described) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # let every process settle into idle
            shells = [g["shell_pid"] for g in described if g["shell_pid"]]
            agents = [g["agent_pid"] for g in described if g["agent_pid"]]
            shell_rss = [_rss_kib(pid) for pid in shells]
            agent_rss = [_rss_kib(pid) for pid in agents]
            server_rss = _rss_kib(sim.process.pid)
            for ws in consoles:
                await ws.close()
    result.update(
        {
            "shell_rss_mib_mean": round(statistics.mean(shell_rss) / 1024, 2) if shell_rss else None,
            "agent_rss_mib_mean": round(statistics.mean(agent_rss) / 1024, 2) if agent_rss else None,
            "agents_running": len(agents),
            "server_rss_growth_mib_per_guest": round((server_rss - base_rss) / 1024 / guests, 3),
            "total_rss_mib_per_idle_guest": round(
                (
                    statistics.mean(shell_rss or [0])
                    + statistics.mean(agent_rss or [0])
                    + (server_rss - base_rss) / guests
                )
                / 1024,
                2,
            ),
        }
    )
    return result


async def bench_consoles(consoles: int, keystrokes: int, think: float) -> dict[str, Any]:
    """``consoles`` sessions type at once; each keystroke's echo is timed from send to receipt."""
    with KubesimServer(guest="shell", nodes=max(3, consoles // 60 + 1)) as sim:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(headers=sim.auth_header(), connector=connector) as session:
            manifests = [vm_manifest(f"tty-{i:03d}", memory="512Mi") for i in range(consoles)]
            await _start_and_wait(sim, session, manifests)
            sockets = await asyncio.gather(
                *(
                    _open_console(session, sim.ws_url + CONSOLE.format(ns="default", name=m["metadata"]["name"]))
                    for m in manifests
                )
            )
            latencies: list[float] = []

            async def typist(ws: aiohttp.ClientWebSocketResponse) -> None:
                for index in range(keystrokes):
                    key = b"abcdefghij"[index % 10 : index % 10 + 1]
                    sent = time.perf_counter()
                    await ws.send_bytes(key)
                    await _read_until(ws, key)
                    latencies.append(time.perf_counter() - sent)
                    if think:
                        await asyncio.sleep(think)
                await ws.send_bytes(b"\x15")  # kill the typed line so the shell stays tidy

            started, cpu_before = time.monotonic(), _cpu_seconds(sim.process.pid)
            await asyncio.gather(*(typist(ws) for ws in sockets))
            elapsed, server_cpu = time.monotonic() - started, _cpu_seconds(sim.process.pid) - cpu_before
            for ws in sockets:
                await ws.close()
    return {
        "consoles": consoles,
        "keystrokes_each": keystrokes,
        "think_seconds": think,
        "echo_p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "echo_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "echo_max_ms": round(max(latencies) * 1000, 2),
        "echoes_per_second": round(len(latencies) / elapsed, 1),
        "server_cpu_us_per_echo": round(server_cpu * 1e6 / len(latencies), 1),
        "server_cpu_share_of_one_core": round(server_cpu / elapsed, 3),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    figures["start_guest_none"] = await bench_start(args.vms, "none")
    figures["start_guest_shell"] = await bench_start(args.vms, "shell")
    figures["idle_guest_memory"] = await bench_guest_memory(args.guests)
    figures["console_single"] = await bench_consoles(1, args.keystrokes * 5, think=0.02)
    figures["consoles_typing"] = await bench_consoles(args.consoles, args.keystrokes, think=0.1)
    figures["consoles_flat_out"] = await bench_consoles(args.consoles, args.keystrokes, think=0.0)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vms", type=int, default=500)
    parser.add_argument("--guests", type=int, default=20)
    parser.add_argument("--consoles", type=int, default=200)
    parser.add_argument("--keystrokes", type=int, default=20)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
