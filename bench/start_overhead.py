"""Start overhead: Start pressed → ``running`` seen by the browser's WebSocket, against the same VMs made directly.

kubesim runs with zero phase delays, so what is left is the portal's own work: the start request, the Celery
provisioning task (Secret and VM), the sync that sees the VMI Running, the agent health check through
portforward, and the push over the channel layer to the page's ``/ws/attempts/<id>/events/`` socket. The portal
runs as in production: daphne, a Celery worker and Celery beat, each its own process, on PostgreSQL and Redis.

Each student's browser is played by an aiohttp client with a logged-in session: it posts to
``/labs/<id>/start/`` (as the lab page's fetch() does), opens the events socket for the attempt it got back,
and stops the clock at the first ``attempt.update`` whose state is ``running``. This is done for one start at a
time (several in a row) and for 100 students pressing Start at the same moment.

Baseline, side by side on the same kubesim: the same Secret and VirtualMachine (the portal's own manifest
builders) created directly with the ``kubernetes`` client and watched until the VMI is Running; and, since the
portal's ``running`` also means the guest agent answered, the same plus the agent's ``/healthz`` through
portforward.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from bench.common import (
    browser_headers,
    emit,
    kubesim,
    live_portal,
    log,
    machine,
    new_csrf_token,
    seed_course,
    session_cookie,
    setup_django,
    summary_ms,
)

SINGLE_STARTS = 8
CONCURRENT_STARTS = 100
START_TIMEOUT_SECONDS = 60
TARGET_P95_SINGLE_MS = 500
TARGET_P95_CONCURRENT_MS = 2000
BASELINE_NAMESPACE = "bench-direct"
RETRY_MAX_SECONDS = 30.0  # the lab page's RETRY_MAX_MS


# --- the portal, as the browser sees it ----------------------------------------------------------------------


async def browser_start(*, http, base_url: str, ws_url: str, lab_id: int, session_key: str) -> dict[str, Any]:
    """One student pressing Start and watching the events socket until the attempt is running."""
    import aiohttp

    csrf = new_csrf_token()
    headers = browser_headers(base_url=base_url, session_key=session_key, csrf_token=csrf)
    started = time.perf_counter()
    async with http.post(f"{base_url}/labs/{lab_id}/start/", headers=headers) as response:
        body = await response.text()
        if response.status != 201:
            return {"error": f"start answered {response.status}: {body[:200]}"}
        answered = time.perf_counter()
        attempt_id = json.loads(body)["attempt"]["id"]
    socket_headers = {"Cookie": headers["Cookie"], "Origin": base_url}
    url = f"{ws_url}/ws/attempts/{attempt_id}/events/"
    retries = 0
    while True:  # the lab page reconnects when its socket is refused or dropped; so does this client
        try:
            outcome = await watch_until_running(http=http, url=url, headers=socket_headers)
        except aiohttp.ClientError as exc:
            outcome = {"retry": f"{type(exc).__name__}: {exc}"}
        if "retry" not in outcome or time.perf_counter() - started > START_TIMEOUT_SECONDS:
            break
        retries += 1
        # static/js/attempt.js's backoff: 500 ms doubling per failure, capped, with jitter.
        await asyncio.sleep(min(RETRY_MAX_SECONDS, 0.5 * 2 ** min(retries, 6)) * (0.5 + random.random() / 2))
    outcome.update(attempt_id=attempt_id, socket_retries=retries)
    if "seen_at" in outcome:
        outcome.update(seconds=outcome["seen_at_perf"] - started, request_seconds=answered - started)
    elif "error" not in outcome:
        outcome["error"] = f"gave up reconnecting: {outcome.pop('retry')}"
    return outcome


async def watch_until_running(*, http, url: str, headers: dict[str, str]) -> dict[str, Any]:
    async with http.ws_connect(url, headers=headers) as socket:
        async for message in socket:
            if message.type.name != "TEXT":
                break
            payload = json.loads(message.data)
            attempt = payload.get("attempt") if payload.get("type") == "attempt.update" else None
            if attempt and attempt["state"] == "running":
                return {"seen_at": time.time(), "seen_at_perf": time.perf_counter()}
            if attempt and attempt["state"] in ("failed", "stopped", "expired"):
                return {"error": f"attempt ended {attempt['state']}: {attempt.get('failure_reason', '')}"}
    return {"retry": "the events socket closed before the attempt was running"}


async def browser_starts(*, base_url: str, ws_url: str, lab_id: int, session_keys: list[str]) -> list[dict]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=START_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        async def one(key: str) -> dict:
            try:
                return await asyncio.wait_for(
                    browser_start(http=http, base_url=base_url, ws_url=ws_url, lab_id=lab_id, session_key=key),
                    timeout=START_TIMEOUT_SECONDS + 10)
            except (TimeoutError, aiohttp.ClientError) as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}

        return list(await asyncio.gather(*(one(key) for key in session_keys)))


def server_side_phases(results: list[dict]) -> dict[str, Any]:
    """Where the time went, from the attempts' own timestamps (and the moment the browser saw ``running``)."""
    from labs.models import Attempt

    seen = {result["attempt_id"]: result["seen_at"] for result in results if "seconds" in result}
    spans: dict[str, list[float]] = {"provision": [], "vm_to_vmi_running": [], "vmi_running_to_agent_ready": [],
                                     "agent_ready_to_browser": []}
    for attempt in Attempt.objects.filter(id__in=seen):
        if attempt.provisioned_at:
            spans["provision"].append((attempt.provisioned_at - attempt.requested_at).total_seconds())
        if attempt.provisioned_at and attempt.vmi_running_at:
            spans["vm_to_vmi_running"].append((attempt.vmi_running_at - attempt.provisioned_at).total_seconds())
        if attempt.vmi_running_at and attempt.agent_ready_at:
            spans["vmi_running_to_agent_ready"].append(
                (attempt.agent_ready_at - attempt.vmi_running_at).total_seconds())
        if attempt.agent_ready_at:
            spans["agent_ready_to_browser"].append(seen[attempt.id] - attempt.agent_ready_at.timestamp())
    return {name: summary_ms(values) for name, values in spans.items()}


def server_side_running(attempt_ids: list[int]) -> dict[str, Any]:
    """Request to ``running`` as the attempts' own rows record it, whether or not a browser saw it in time: the
    lifecycle's part, without the events socket."""
    from labs.models import Attempt

    rows = Attempt.objects.filter(id__in=attempt_ids).values_list("state", "requested_at", "agent_ready_at")
    durations = [(ready - requested).total_seconds() for _state, requested, ready in rows if ready]
    return {"attempts": len(attempt_ids), "reached_running": len(durations), **summary_ms(durations)}


def measure_portal(*, portal, lab_id: int, students: list) -> dict[str, Any]:
    keys = [session_cookie(student) for student in students]
    singles = []
    for key in keys[:SINGLE_STARTS]:
        singles += asyncio.run(browser_starts(base_url=portal.base_url, ws_url=portal.ws_url, lab_id=lab_id,
                                              session_keys=[key]))
    log(f"portal: {CONCURRENT_STARTS} simultaneous starts")
    together = asyncio.run(browser_starts(base_url=portal.base_url, ws_url=portal.ws_url, lab_id=lab_id,
                                          session_keys=keys[SINGLE_STARTS:SINGLE_STARTS + CONCURRENT_STARTS]))

    def figures(results: list[dict]) -> dict[str, Any]:
        good = [result for result in results if "seconds" in result]
        errors = [result["error"] for result in results if "error" in result]
        return {
            **summary_ms([result["seconds"] for result in good]),
            "start_request": summary_ms([result["request_seconds"] for result in good]),
            "socket_reconnects": sum(result.get("socket_retries", 0) for result in results),
            "phases": server_side_phases(good),
            "server_side": server_side_running([result["attempt_id"] for result in results if "attempt_id" in result]),
            "failed": len(errors),
            "errors": sorted(set(errors))[:5],
        }

    return {"single": figures(singles), "concurrent_100": figures(together)}


# --- the baseline: the kubernetes client directly ------------------------------------------------------------


class VmiRunningWatch:
    """One watch on the namespace's VMIs, noting when each first reports phase Running."""

    def __init__(self, api_client, namespace: str) -> None:
        from kubernetes import client, watch

        self.running_at: dict[str, float] = {}
        self.events: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self._watch = watch.Watch()
        self._api = client.CustomObjectsApi(api_client)
        self._namespace = namespace
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def event_for(self, name: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(name, threading.Event())

    def _run(self) -> None:
        listing = self._api.list_namespaced_custom_object("kubevirt.io", "v1", self._namespace,
                                                          "virtualmachineinstances")
        version = listing["metadata"]["resourceVersion"]
        self._ready.set()
        for event in self._watch.stream(self._api.list_namespaced_custom_object, "kubevirt.io", "v1",
                                        self._namespace, "virtualmachineinstances", resource_version=version,
                                        timeout_seconds=600):
            vmi = event["object"]
            name = vmi["metadata"]["name"]
            if (vmi.get("status") or {}).get("phase") == "Running":
                with self.lock:
                    if name not in self.running_at:
                        self.running_at[name] = time.perf_counter()
                self.event_for(name).set()

    def stop(self) -> None:
        self._watch.stop()


def direct_start(*, api_client, running: VmiRunningWatch, index: int, tag: str) -> dict[str, float]:
    """Create the same Secret and VM the portal would, wait for Running, then for the agent to answer."""
    from kubernetes import client

    from grading.agent_client import AgentError, healthz
    from guest.cloud_init import render_user_data
    from labs.kubevirt import manifests

    name = f"direct-{tag}-{index}"
    token = secrets.token_urlsafe(32)
    labels = {"app.kubernetes.io/managed-by": "bench"}
    secret = manifests.cloud_init_secret(name=f"{name}-cloud-init", namespace=BASELINE_NAMESPACE, labels=labels,
                                         user_data=render_user_data(token=token))
    vm = manifests.virtual_machine(name=name, namespace=BASELINE_NAMESPACE, labels=labels,
                                   image="quay.io/containerdisks/fedora:41", vcpus=1, memory_mib=2048,
                                   host_passthrough=False, cloud_init_secret=f"{name}-cloud-init")
    event = running.event_for(name)
    started = time.perf_counter()
    client.CoreV1Api(api_client).create_namespaced_secret(BASELINE_NAMESPACE, secret)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "kubevirt.io", "v1", BASELINE_NAMESPACE, "virtualmachines", vm)
    if not event.wait(START_TIMEOUT_SECONDS):
        return {"error": 1.0}
    running_seconds = running.running_at[name] - started
    target = SimpleNamespace(namespace=BASELINE_NAMESPACE, vm_name=name, agent_token=token)
    deadline = time.perf_counter() + START_TIMEOUT_SECONDS
    while True:
        try:
            healthz(target, timeout_s=3)
            break
        except AgentError:
            if time.perf_counter() > deadline:
                return {"running": running_seconds, "error": 1.0}
            time.sleep(0.02)
    return {"running": running_seconds, "agent_ready": time.perf_counter() - started}


def measure_direct(*, server) -> dict[str, Any]:
    from kubernetes import client, config

    configuration = client.Configuration()
    configuration.connection_pool_maxsize = CONCURRENT_STARTS + 10  # one connection per creating thread
    api_client = config.new_client_from_config(config_file=str(server.kubeconfig),
                                               client_configuration=configuration)
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": BASELINE_NAMESPACE}})
    running = VmiRunningWatch(api_client, BASELINE_NAMESPACE)
    try:
        singles = [direct_start(api_client=api_client, running=running, index=index, tag="one")
                   for index in range(SINGLE_STARTS)]
        log(f"direct: {CONCURRENT_STARTS} simultaneous creates")
        with ThreadPoolExecutor(max_workers=CONCURRENT_STARTS) as pool:
            together = list(pool.map(
                lambda index: direct_start(api_client=api_client, running=running, index=index, tag="many"),
                range(CONCURRENT_STARTS)))
    finally:
        running.stop()
    # The baseline's VMs make room for the portal's: deleted before the portal is measured.
    client.CoreV1Api(api_client).delete_namespace(BASELINE_NAMESPACE)

    def figures(results: list[dict]) -> dict[str, Any]:
        return {
            "to_vmi_running": summary_ms([r["running"] for r in results if "running" in r]),
            "to_agent_ready": summary_ms([r["agent_ready"] for r in results if "agent_ready" in r]),
            "failed": sum(1 for r in results if "error" in r),
        }

    return {"single": figures(singles), "concurrent_100": figures(together)}


def main() -> None:
    setup_django()
    seeded = seed_course(students=SINGLE_STARTS + CONCURRENT_STARTS, labs=1, name="Bench Start University")
    lab = seeded.labs[0]
    with kubesim(name="kubesim-start", guest="shell") as server:
        from django.conf import settings

        from labs.kubevirt import client as kube_client

        settings.KUBECONFIG = str(server.kubeconfig)  # the baseline's agent checks use the same cluster
        kube_client.reset()
        log("direct baseline")
        direct = measure_direct(server=server)
        with live_portal(kubeconfig=server.kubeconfig, worker_concurrency=8) as portal:
            log("portal: single starts")
            measured = measure_portal(portal=portal, lab_id=lab.id, students=seeded.students)
            portal.check_alive()

    single_p95 = measured["single"]["p95_ms"]
    many_p95 = measured["concurrent_100"]["p95_ms"]
    emit({
        "benchmark": "start_overhead",
        "description": "Start request -> 'running' seen on the attempt's events WebSocket, kubesim with zero "
                       "delays, portal as daphne + Celery worker + beat on PostgreSQL and Redis; baseline: the "
                       "same Secret and VM created with the kubernetes client and watched to VMI Running (and "
                       "to the agent answering /healthz through portforward)",
        "target": {"single_p95_ms": TARGET_P95_SINGLE_MS, "concurrent_100_p95_ms": TARGET_P95_CONCURRENT_MS},
        "figures": measured,
        "baseline": direct,
        "overhead_vs_direct_agent_ready_p95_ms": {
            key: (None if measured[key]["p95_ms"] is None or direct[key]["to_agent_ready"]["p95_ms"] is None
                  else round(measured[key]["p95_ms"] - direct[key]["to_agent_ready"]["p95_ms"], 2))
            for key in ("single", "concurrent_100")
        },
        "verdict": {
            "single_meets_target": single_p95 is not None and single_p95 <= TARGET_P95_SINGLE_MS,
            "concurrent_100_meets_target": many_p95 is not None and many_p95 <= TARGET_P95_CONCURRENT_MS,
        },
        "machine": machine(),
    })


if __name__ == "__main__":
    main()
