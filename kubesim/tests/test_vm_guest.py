"""The vm guest: a real QEMU VM per VMI, booted from the lab image and read by real cloud-init (marked vm)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import websocket
from kubernetes import client
from kubernetes.client.rest import ApiException

from guest.cloud_init import render_user_data
from kubesim.testing import KubesimServer
from kubesim.tests.support import GROUP, VERSION, condition, secret_manifest, vm_manifest, wait_for

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1500)]  # TCG boots on a loaded machine take minutes

REPO = Path(__file__).resolve().parents[2]
TOKEN = "vm-guest-test-token-0123456789"
BOOT_TIMEOUT = 420  # TCG on a busy 2-core machine: a boot takes 30 s idle, several minutes under load
# Any other wait on the guest or on kubesim's processes (start, a shell's answer, QEMU's exit): seconds idle,
# far longer on a loaded machine, so only a deadline this generous tells "slow" from "never".
SLOW_TIMEOUT = 180


@pytest.fixture(scope="module")
def image() -> str:
    """The lab guest image, built first if the cache has none (a few minutes, once)."""
    result = subprocess.run([str(REPO / "guest/image/build")], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture(scope="module")
def sim(image, tmp_path_factory):
    with KubesimServer(tmp_path_factory.mktemp("kubesim-vm"), guest="vm", guest_image=image) as server:
        yield server


@pytest.fixture(scope="module")
def apis(sim):
    api = sim.api_client()
    yield client.CoreV1Api(api), client.CustomObjectsApi(api)
    api.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _vmi(custom, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _phase(custom, name: str) -> str | None:
    return ((_vmi(custom, name) or {}).get("status") or {}).get("phase")


def _start(core, custom, name: str, *, run_strategy: str = "Always") -> None:
    core.create_namespaced_secret("default", secret_manifest(f"{name}-ci", render_user_data(token=TOKEN)))
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        "virtualmachines",
        vm_manifest(
            name, cloud_init_secret=f"{name}-ci", image="quay.io/containerdisks/debian:12", run_strategy=run_strategy
        ),
    )


def _console(sim, name: str) -> websocket.WebSocket:
    return websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}/console",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=30,
    )


def _type_until(ws: websocket.WebSocket, keys: bytes, marker: bytes, *, timeout: float) -> bytes:
    """Send keys (again every few seconds: a getty may still be starting) until the output holds marker."""
    output = b""
    deadline = time.monotonic() + timeout
    ws.settimeout(3)
    while marker not in output:
        assert time.monotonic() < deadline, f"no {marker!r} on the console; last output {output[-400:]!r}"
        ws.send_binary(keys)
        with_timeout = time.monotonic() + 3
        while marker not in output and time.monotonic() < with_timeout:
            try:
                output += ws.recv()
            except websocket.WebSocketTimeoutException:
                break
    return output


def _agent_request(sim, name: str, port: int, request: bytes) -> tuple[int, bytes]:
    """One HTTP exchange with a guest port through the portforward subresource."""
    ws = websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}"
        f"/portforward/{port}/tcp",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=30,
    )
    ws.send_binary(request)
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
        chunk = ws.recv()
        if not chunk:
            return 0, b""  # the guest closed the connection without a word: nothing listening yet
        answer += chunk
    ws.close()
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[1]


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_a_vm_boots_reports_its_agent_and_logs_the_student_in(sim, apis):
    core, custom = apis
    started = time.monotonic()
    _start(core, custom, "boot")
    wait_for(lambda: _phase(custom, "boot") == "Running", timeout=SLOW_TIMEOUT, what="VMI Running")
    guest = sim.admin.guest("default", "boot")
    assert guest["qemu_pid"] and _alive(guest["qemu_pid"])
    wait_for(
        lambda: condition(_vmi(custom, "boot"), "AgentConnected"),
        timeout=BOOT_TIMEOUT,
        interval=1,
        what="qemu-guest-agent connected",
    )
    agent_connected = time.monotonic() - started
    status = _vmi(custom, "boot")["status"]
    assert status["guestOSInfo"]["id"] == "debian"  # the guest's own answer, not a guess from the image name
    assert status["guestOSInfo"]["kernelRelease"].endswith("-cloud-amd64")
    assert status["guestHostname"] == "boot"

    # The lab agent, installed and started by real cloud-init under systemd, through portforward.
    def healthz() -> dict | None:
        try:
            code, body = _agent_request(
                sim,
                "boot",
                8787,
                b"GET /healthz HTTP/1.1\r\nHost: agent\r\n"
                b"Authorization: Bearer " + TOKEN.encode() + b"\r\nConnection: close\r\n\r\n",
            )
        except websocket.WebSocketBadStatusException:
            return None  # 500 while nothing listens on the port yet
        except websocket.WebSocketTimeoutException:
            return None  # a guest too busy to answer within the socket's timeout: ask again
        return json.loads(body) if code == 200 and json.loads(body).get("setup_finished") else None

    health = wait_for(healthz, timeout=BOOT_TIMEOUT, interval=2, what="lab agent ready")
    assert health["ready"]
    agent_ready = time.monotonic() - started

    # The serial getty logs the student in with no password: a command typed there runs as the student.
    ws = _console(sim, "boot")
    output = _type_until(ws, b"\recho who=$(id -un)@$(hostname)\r", b"who=student@boot", timeout=BOOT_TIMEOUT)
    assert b"who=student@boot" in output
    print(
        f"\nvm guest under {guest['accelerator']}: agent connected {agent_connected:.1f} s, "
        f"lab agent ready {agent_ready:.1f} s after the VM was created"
    )

    # One console client at a time: a second one takes the line, the first is dropped.
    second = _console(sim, "boot")
    ws.settimeout(SLOW_TIMEOUT)
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError, OSError)):
        while True:
            ws.recv()
    output = _type_until(second, b"echo second=$((40+2))\r", b"second=42", timeout=SLOW_TIMEOUT)
    second.close()


def test_the_cluster_says_which_accelerator_its_guests_run_under(sim, apis):
    core, custom = apis
    kubevirt = custom.get_namespaced_custom_object(GROUP, VERSION, "kubevirt", "kubevirts", "kubevirt")
    state = sim.admin.state()
    accelerator = state["accelerator"]
    assert accelerator in ("kvm", "tcg") and state["accelerator_reason"]
    annotations = kubevirt["metadata"]["annotations"]
    assert annotations["kubesim.io/accelerator"] == accelerator
    assert annotations["kubesim.io/accelerator-reason"] == state["accelerator_reason"]
    emulated = kubevirt["spec"]["configuration"]["developerConfiguration"].get("useEmulation", False)
    assert emulated == (accelerator == "tcg")
    for node in core.list_node().items:
        assert (node.status.allocatable["devices.kubevirt.io/kvm"] == "0") == (accelerator == "tcg")


def test_a_vmi_whose_qemu_dies_fails_as_virt_handler_reports_a_crash(sim, apis):
    core, custom = apis
    _start(core, custom, "crash", run_strategy="Once")
    guest = wait_for(
        lambda: (g := sim.admin.guest("default", "crash")) and g["qemu_pid"] and g,
        timeout=SLOW_TIMEOUT,
        what="QEMU started",
    )
    assert _phase(custom, "crash") == "Running"
    os.kill(guest["qemu_pid"], signal.SIGKILL)
    wait_for(lambda: _phase(custom, "crash") == "Failed", timeout=SLOW_TIMEOUT, what="VMI Failed")
    status = _vmi(custom, "crash")["status"]
    assert "reason" not in status  # v1.9 writes status.reason only for a lost node
    ready = condition({"status": status}, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "GuestNotRunning")
    assert condition({"status": status}, "AgentConnected") is None
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=crash").items
    crashed = [e for e in events if e.reason == "Stopped" and e.type == "Warning"]
    assert crashed and crashed[0].message == "The VirtualMachineInstance crashed."
    assert crashed[0].source.component == "virt-handler"
    pods = core.list_namespaced_pod("default", label_selector="kubevirt.io=virt-launcher").items
    assert all(p.status.phase == "Failed" for p in pods if p.metadata.name.startswith("virt-launcher-crash-"))
    wait_for(lambda: not _alive(guest["qemu_pid"]), timeout=SLOW_TIMEOUT, what="QEMU reaped")
    assert sim.admin.guest("default", "crash") is None


def test_portforward_to_a_port_nothing_listens_on_is_refused_with_500(sim, apis):
    wait_for(
        lambda: condition(_vmi(apis[1], "boot"), "AgentConnected"), timeout=BOOT_TIMEOUT, interval=1, what="guest up"
    )
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/boot"
            "/portforward/2222/tcp",
            header=[f"Authorization: Bearer {sim.token}"],
            subprotocols=["plain.kubevirt.io"],
            timeout=30,
        )
    assert refused.value.status_code == 500
    assert b"connection refused" in refused.value.resp_body


def test_a_guest_power_off_ends_the_vmi_succeeded_and_its_qemu(sim, apis):
    core, custom = apis
    wait_for(
        lambda: condition(_vmi(custom, "boot"), "AgentConnected"), timeout=BOOT_TIMEOUT, interval=1, what="guest up"
    )
    pid = sim.admin.guest("default", "boot")["qemu_pid"]
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", "virtualmachines", "boot", {"spec": {"runStrategy": "Manual"}}
    )
    body = json.dumps({"checks": [{"id": "off", "command": "systemctl poweroff", "timeout_s": 10}]}).encode()
    # The guest powers off under the request: a slow one may neither answer nor close within the socket's timeout.
    with contextlib.suppress(websocket.WebSocketTimeoutException):
        _agent_request(
            sim,
            "boot",
            8787,
            b"POST /v1/run HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body,
        )
    wait_for(lambda: _phase(custom, "boot") == "Succeeded", timeout=BOOT_TIMEOUT, interval=1, what="VMI Succeeded")
    wait_for(lambda: not _alive(pid), timeout=SLOW_TIMEOUT, what="QEMU gone")


def test_killing_kubesim_leaves_no_qemu(image, tmp_path):
    sim = KubesimServer(tmp_path, guest="vm", guest_image=image).start()
    api = sim.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    _start(core, custom, "orphan")
    guest = wait_for(
        lambda: (g := sim.admin.guest("default", "orphan")) and g["qemu_pid"] and g,
        timeout=SLOW_TIMEOUT,
        what="QEMU started",
    )
    api.close()
    os.kill(sim.process.pid, signal.SIGKILL)
    sim.process.wait()
    wait_for(lambda: not _alive(guest["qemu_pid"]), timeout=SLOW_TIMEOUT, what="QEMU gone with kubesim")
    sim.stop()
