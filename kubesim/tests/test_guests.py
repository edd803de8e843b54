"""Guests are real processes and directories: they go when their VMI goes and when kubesim stops."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kubernetes import client

from kubesim.testing import KubesimServer
from kubesim.tests.support import GROUP, VERSION, agent_user_data, secret_manifest, vm_manifest, wait_for


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _boot_guest(sim: KubesimServer, core: client.CoreV1Api, custom: client.CustomObjectsApi, name: str) -> dict:
    """A VM whose guest runs the agent and a shell (started by a console connection) with a background job."""
    import websocket

    core.create_namespaced_secret("default", secret_manifest(f"{name}-ci", agent_user_data(token="x" * 20)))
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "virtualmachines", vm_manifest(name, cloud_init_secret=f"{name}-ci")
    )
    wait_for(
        lambda: (g := sim.admin.guest("default", name)) and g["agent_pid"] and g["ports"].get("8787"), what="agent up"
    )
    ws = websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}/console",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=10,
    )
    ws.send_binary(b"sleep 300 & echo job=$!\r")
    output = b""
    while b"job=" not in output or not output.split(b"job=")[-1].split(b"\r")[0].strip().isdigit():
        output += ws.recv()
    ws.close()
    guest = sim.admin.guest("default", name)
    # The job's number is its PID inside the guest's own PID namespace: find it on the host as a sleep 300
    # descended from the shell's sandbox.
    guest["job_pid"] = wait_for(
        lambda: next((pid for pid in _descendants(guest["shell_pid"]) if _cmdline(pid) == "sleep 300"), None),
        what="the job on the host",
    )
    return guest


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def test_deleting_a_vm_kills_its_guest_processes_and_removes_its_directory(tmp_path):
    with KubesimServer(tmp_path) as sim:
        api = sim.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        guest = _boot_guest(sim, core, custom, "short")
        pids = [guest["shell_pid"], guest["agent_pid"], guest["job_pid"]]
        assert all(_alive(pid) for pid in pids)
        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachines", "short")
        wait_for(lambda: not any(_alive(pid) for pid in pids), what="guest processes gone")
        wait_for(lambda: not Path(guest["root"]).exists(), what="guest directory gone")
        api.close()


def test_stopping_kubesim_cleans_up_every_guest(tmp_path):
    sim = KubesimServer(tmp_path).start()
    try:
        api = sim.api_client()
        guest = _boot_guest(sim, client.CoreV1Api(api), client.CustomObjectsApi(api), "left")
        api.close()
    finally:
        sim.process.send_signal(signal.SIGINT)  # Ctrl-C in a terminal; SIGTERM takes the same path in stop()
        sim.process.wait(timeout=20)
        sim.stop()
    pids = [guest["shell_pid"], guest["agent_pid"], guest["job_pid"]]
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    assert not Path(guest["root"]).parent.exists(), "the guests' base directory is removed"
    assert os.path.exists(sim.kubeconfig)


def test_a_killed_kubesims_guest_directories_are_swept_by_the_next_one(tmp_path):
    import tempfile

    dead = _pid_of_an_exited_process()
    orphan = Path(tempfile.gettempdir()) / f"kubesim-guests-{dead}-leftover"
    (orphan / "default_vm_1234/home/student").mkdir(parents=True)
    with KubesimServer(tmp_path):
        assert not orphan.exists()


def _pid_of_an_exited_process() -> int:
    import subprocess

    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
