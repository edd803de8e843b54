"""Grading overhead: a 10-check lab graded through the portal vs the same checks sent to the agent directly.

One kubesim guest runs the real agent; the same ten checks are timed, interleaved, in four ways:

- ``direct``: an HTTP POST to the agent's own socket (what the guest costs by itself, the floor);
- ``portforward``: ``labs.agent_client.run_checks`` through the VMI ``portforward/8787/tcp`` subresource
  (the transport the portal uses: WebSocket handshake, raw TCP in binary frames);
- ``service``: ``grading.services.grading_run_execute`` in this process (claim, portforward, evaluation, results
  and grade stored), with no HTTP and no queue;
- ``portal``: the student's Check button on a live portal (daphne, a Celery worker on Redis, as in production):
  POST ``/attempts/<id>/check/`` until the ``grading.update`` saying ``done`` arrives on the attempt's
  channel-layer group, exactly what the browser waits for.

``added_ms`` is the portal's p50/p95 minus the direct p50/p95; DESIGN §9 holds it to ≤ 300 ms.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import queue
import secrets
import socket
import threading
import time
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

ITERATIONS = 20
WARMUP = 2
TARGET_ADDED_MS = 300
CHECK_COMMANDS = [
    ("home exists", "test -d ~", None, ""),
    ("shell works", "echo ready", "contains", "ready"),
    ("file listing", "ls -la ~ | head -n 5", None, ""),
    ("kernel name", "uname -s", "regex", r"^\w+"),
    ("path set", "printenv PATH", "contains", "/"),
    ("arithmetic", "echo $((6 * 7))", "contains", "42"),
    ("date runs", "date +%Y", "regex", r"^\d{4}$"),
    ("word count", "printf 'a b c' | wc -w", "regex", r"3"),
    ("no such file", "test ! -e ~/does-not-exist", None, ""),
    ("python present", "command -v python3 || command -v sh", None, ""),
]
REQUEST_TIMEOUT_S = 30.0


def prepare_lab(seeded) -> list[Any]:
    from labs.models import Check

    checks = list(Check.objects.filter(lab=seeded.labs[0]).order_by("order"))
    for check, (title, command, match, pattern) in zip(checks, CHECK_COMMANDS, strict=True):
        check.title, check.command, check.timeout_s = title, command, 10
        check.stdout_match, check.stdout_pattern = (match or "none"), pattern
        check.save()
    return checks


def provision(seeded, server) -> Any:
    """A running attempt with its own Secret and VM, built by the lifecycle's manifest builders."""
    from django.utils import timezone
    from kubernetes.client.exceptions import ApiException

    from guest.cloud_init import render_user_data
    from labs import agent_client
    from labs.kubevirt import client as kube_client
    from labs.kubevirt import manifests, names, operations
    from labs.models import Attempt, AttemptState

    lab, student = seeded.labs[0], seeded.students[0]
    attempt = Attempt.objects.create(
        lab=lab,
        student=student,
        tenant=seeded.tenant,
        state=AttemptState.STARTING,
        namespace=seeded.tenant.namespace,
        agent_token=secrets.token_urlsafe(32),
    )
    attempt.vm_name = names.vm_name(attempt.pk)
    attempt.save(update_fields=["vm_name"])
    try:
        kube_client.core_v1().create_namespace({"metadata": {"name": attempt.namespace}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    labels = names.attempt_labels(
        tenant_id=seeded.tenant.pk, course_id=lab.course_id, lab_id=lab.pk, attempt_id=attempt.pk
    )
    secret = names.cloud_init_secret_name(attempt.vm_name)
    operations.secret_create(
        manifests.cloud_init_secret(
            name=secret,
            namespace=attempt.namespace,
            labels=labels,
            user_data=render_user_data(token=attempt.agent_token),
        )
    )
    operations.vm_create(
        manifests.virtual_machine(
            name=attempt.vm_name,
            namespace=attempt.namespace,
            labels=labels,
            image=lab.image,
            vcpus=1,
            memory_mib=2048,
            host_passthrough=False,
            cloud_init_secret=secret,
        )
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            agent_client.healthz(attempt)
            break
        except agent_client.AgentError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent never answered: {exc.code}: {exc}") from exc
            time.sleep(0.1)
    attempt.state, attempt.agent_ready_at = AttemptState.RUNNING, timezone.now()
    attempt.save(update_fields=["state", "agent_ready_at"])
    return attempt


def agent_socket(server, attempt) -> str:
    """The Unix socket the sandboxed shell guest's agent listens on (guest port 8787 leads there)."""
    guest = server.admin.guest(attempt.namespace, attempt.vm_name)
    return guest["ports"]["8787"]


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to a Unix socket: the agent called directly, with nothing of the cluster in between."""

    def __init__(self, path: str, *, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def direct_run(*, agent: str, token: str, checks) -> float:
    body = json.dumps(
        {"checks": [{"id": str(c.pk), "command": c.command, "timeout_s": c.timeout_s} for c in checks]}
    ).encode()
    started = time.perf_counter()
    connection = UnixHTTPConnection(agent, timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request(
            "POST",
            "/v1/run",
            body=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Connection": "close"},
        )
        response = connection.getresponse()
        payload = json.loads(response.read())
    finally:
        connection.close()
    elapsed = time.perf_counter() - started
    if response.status != 200 or len(payload["results"]) != len(checks):
        raise RuntimeError(f"direct run failed: {response.status} {payload}")
    return elapsed


def portforward_run(*, attempt, checks) -> float:
    from labs import agent_client

    started = time.perf_counter()
    results = agent_client.run_checks(attempt, checks)
    elapsed = time.perf_counter() - started
    assert len(results) == len(checks)
    return elapsed


def service_run(*, attempt) -> float:
    from grading.models import GradingRun, RunState
    from grading.services import grading_run_execute

    started = time.perf_counter()
    run = GradingRun.objects.create(attempt=attempt, state=RunState.QUEUED)
    run = grading_run_execute(run_id=run.pk)
    elapsed = time.perf_counter() - started
    if run is None or run.state != RunState.DONE:
        raise RuntimeError(f"service run did not finish: {run and (run.error_code, run.error)}")
    return elapsed


class PortalClient:
    """A logged-in student pressing Check on the live portal and waiting for the result push.

    The attempt's channel-layer group is followed from a thread with an event loop of its own (the Redis channel
    layer keeps per-loop state, so one loop must do all the receiving); messages reach the caller through a queue.
    """

    def __init__(self, *, portal, attempt, student) -> None:
        import requests

        self.session = requests.Session()
        self.url = f"{portal.base_url}/attempts/{attempt.pk}/check/"
        self.headers = browser_headers(
            base_url=portal.base_url, session_key=session_cookie(student), csrf_token=new_csrf_token()
        )
        self.group = f"attempt-{attempt.pk}"
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("could not join the attempt's channel-layer group")

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(self.group, channel)
        self._ready.set()
        try:
            while not self._stop.is_set():
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=0.5)
                except TimeoutError:
                    continue
                self.messages.put(message)
        finally:
            await layer.group_discard(self.group, channel)

    def run(self) -> tuple[float, int]:
        started = time.perf_counter()
        response = self.session.post(self.url, headers=self.headers, timeout=REQUEST_TIMEOUT_S)
        if response.status_code != 202:
            raise RuntimeError(f"Check refused: {response.status_code} {response.text[:300]}")
        run_id = response.json()["run"]["id"]
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            try:
                message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no result for run {run_id} within {REQUEST_TIMEOUT_S} s") from None
            run = message.get("run") or {}
            if message.get("type") == "grading.update" and run.get("id") == run_id and run.get("finished"):
                if run["state"] != "done":
                    raise RuntimeError(f"portal run {run_id} ended {run['state']}: {run.get('error')}")
                return time.perf_counter() - started, run_id

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def main() -> None:
    load_before = os.getloadavg()[0]
    with kubesim(name="kubesim-grading", nodes=2) as server:
        setup_django(KUBECONFIG=str(server.kubeconfig), GRADING_MIN_INTERVAL_SECONDS="0", RATE_LIMIT_CHECKS="100000")
        from grading.models import GradingRun, RunState

        seeded = seed_course(students=1, labs=1, checks_per_lab=len(CHECK_COMMANDS))
        checks = prepare_lab(seeded)
        log("provisioning the guest")
        attempt = provision(seeded, server)
        agent = agent_socket(server, attempt)
        log("starting the live portal")
        with live_portal(
            kubeconfig=server.kubeconfig,
            worker_concurrency=2,
            beat=False,
            env={"GRADING_MIN_INTERVAL_SECONDS": "0", "RATE_LIMIT_CHECKS": "100000"},
        ) as portal:
            client = PortalClient(portal=portal, attempt=attempt, student=seeded.students[0])
            timings: dict[str, list[float]] = {"direct": [], "portforward": [], "service": [], "portal": []}
            portal_runs: list[int] = []
            try:
                for iteration in range(WARMUP + ITERATIONS):
                    measured = {
                        "direct": direct_run(agent=agent, token=attempt.agent_token, checks=checks),
                        "portforward": portforward_run(attempt=attempt, checks=checks),
                        "service": service_run(attempt=attempt),
                    }
                    measured["portal"], run_id = client.run()
                    if iteration >= WARMUP:
                        portal_runs.append(run_id)
                        for mode, seconds in measured.items():
                            timings[mode].append(seconds)
            finally:
                client.close()
        queue_waits, executions = [], []
        for run in GradingRun.objects.filter(pk__in=portal_runs, state=RunState.DONE):
            queue_waits.append((run.started_at - run.created_at).total_seconds())
            executions.append((run.finished_at - run.started_at).total_seconds())

    summaries = {mode: summary_ms(values) for mode, values in timings.items()}
    added = {
        f"{q}_ms": round(summaries["portal"][f"{q}_ms"] - summaries["direct"][f"{q}_ms"], 2) for q in ("p50", "p95")
    }
    emit(
        {
            "benchmark": "grading_overhead",
            "checks": len(checks),
            "iterations": ITERATIONS,
            "direct": summaries["direct"],
            "portforward": summaries["portforward"],
            "service": summaries["service"],
            "portal": summaries["portal"],
            "portal_breakdown": {"queue_wait": summary_ms(queue_waits), "execution": summary_ms(executions)},
            "added_by_portforward_p50_ms": round(summaries["portforward"]["p50_ms"] - summaries["direct"]["p50_ms"], 2),
            "added_by_portal": added,
            "target_added_ms": TARGET_ADDED_MS,
            "meets_target": added["p95_ms"] <= TARGET_ADDED_MS,
            # The machine is shared: the load during the run says how far the figures are from an idle machine's.
            "load_average_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
