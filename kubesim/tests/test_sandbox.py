"""The shell guest is a sandbox: no portal files, no other guest's files or processes, not root on the host."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import websocket
from kubernetes import client

from kubesim.testing import KubesimServer
from kubesim.tests.support import GROUP, VERSION, agent_user_data, secret_manifest, vm_manifest, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with KubesimServer(tmp_path_factory.mktemp("kubesim-sandbox"), guest="shell") as server:
        yield server


@pytest.fixture(scope="module")
def guests(sim):
    """Two running guests, each with its agent up."""
    api = sim.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    names = []
    for name in ("alice", "bob"):
        core.create_namespaced_secret("default", secret_manifest(f"{name}-ci", agent_user_data(token="x" * 20)))
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", "virtualmachines", vm_manifest(name, cloud_init_secret=f"{name}-ci")
        )
        names.append(name)
    for name in names:
        wait_for(lambda n=name: (g := sim.admin.guest("default", n)) and g["ports"].get("8787"), what=f"{name} up")
    yield {name: sim.admin.guest("default", name) for name in names}
    api.close()


def run_in(sim, name: str, command: str) -> str:
    """Type a command on the guest's console and return what it printed."""
    marker = uuid.uuid4().hex[:8]
    ws = websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}/console",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=10,
    )
    try:
        # Echo off first: a long command line wraps on the 80-column console, and its echo must not be mistaken for
        # output. The markers are computed by the shell, so only its output contains them as written here.
        read_until(ws, f"stty -echo; echo READY-$((6*7))-{marker}\r", f"READY-42-{marker}")
        output = read_until(ws, f"{command}; echo; echo END-$((6*7))-{marker}\r", f"END-42-{marker}")
    finally:
        ws.close()
    return output.split(f"END-42-{marker}", 1)[0]


def read_until(ws, typed: str, marker: str) -> str:
    ws.send_binary(typed.encode())
    output = b""
    while marker.encode() not in output:
        output += ws.recv()
    return output.decode(errors="replace")


def host_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return int(next(line for line in handle if line.startswith("Uid:")).split()[2])


def test_the_portal_files_are_not_there_to_read_or_write(sim, guests):
    output = run_in(
        sim,
        "alice",
        f"cat {REPO}/manage.py | head -1; ls {REPO}/var; cat {sim.kubeconfig}; "
        f"touch {REPO}/planted; ls /; "
        "(echo > /dev/tcp/127.0.0.1/5432) 2>/dev/null && echo PG-OPEN || echo PG-CLOSED",
    )
    assert "import" not in output and "apiVersion" not in output
    assert output.count("No such file or directory") >= 4
    assert not (REPO / "planted").exists()
    assert "work" not in output.split() and "PG-CLOSED" in output  # no host tree, and the host's database unreachable


def test_another_guests_files_and_processes_are_out_of_sight(sim, guests):
    run_in(sim, "bob", "echo bobs-secret > ~/secret.txt; sleep 777 & true")
    output = run_in(
        sim,
        "alice",
        f"cat {guests['bob']['home']}/secret.txt; ls {Path(guests['bob']['root']).parent}; "
        "ps ax | grep -c 'sleep 77[7]'; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
    )
    assert "bobs-secret" not in output and "sleep 777" not in output
    assert "\r\n0\r\n" in output  # ps sees none of bob's processes
    assert (Path(guests["bob"]["home"]) / "secret.txt").read_text() == "bobs-secret\n"  # it was there to find


def test_nobody_in_a_guest_is_root_on_the_host(sim, guests):
    output = run_in(sim, "alice", "id -u; sleep 888 & echo started")
    assert "1000" in output
    sleepers = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid) == "sleep 888"]
    assert sleepers
    assert all(host_uid(pid) != 0 for pid in sleepers)
    assert host_uid(guests["alice"]["agent_pid"]) != 0  # the agent is root in the guest only
    assert host_uid(guests["alice"]["shell_pid"] or sleepers[0]) != 0


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_the_student_cannot_read_the_agent_token_and_the_agent_still_checks(sim, guests):
    token = "x" * 20  # what agent_user_data installed in both guests
    output = run_in(
        sim,
        "alice",
        "cat /etc/lab-agent/token; ls -A /etc/lab-agent | wc -l; "
        "grep -rs xxxxxxxxxxxxxxxxxxxx / --exclude-dir=proc --exclude-dir=usr -l | grep -v bash_history",
    )
    assert token not in output.replace(f"grep -rs {token}", "")
    assert "No such file or directory" in output and "\r\n0\r\n" in output  # the directory is empty here
    agent_dir = Path(guests["alice"]["agent_dir"])
    assert (agent_dir / "token").read_text().strip() == token  # kept beside the guest's tree
    assert not str(agent_dir).startswith(guests["alice"]["root"] + "/")
    # The agent, in its own sandbox, reads it: a request with the token passes, one without is refused.
    assert _agent_status(sim, "alice", token) == 200
    assert _agent_status(sim, "alice", "not-the-token-at-all") == 401


def _agent_status(sim, name: str, token: str) -> int:
    ws = websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}"
        "/portforward/8787/tcp",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=10,
    )
    try:
        ws.send_binary(f"GET /healthz HTTP/1.1\r\nHost: guest\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        answer = b""
        while b"\r\n" not in answer:
            answer += ws.recv()
    finally:
        ws.close()
    return int(answer.split(b" ", 2)[1])


def agent_post(guest: dict, path: str, body: dict, *, token: str = "x" * 20) -> tuple[int, dict]:
    """POST to a guest's agent through the Unix socket its port 8787 leads to."""
    import http.client
    import json
    import socket

    connection = http.client.HTTPConnection("guest", timeout=10)
    connection.sock = socket.socket(socket.AF_UNIX)
    connection.sock.connect(guest["ports"]["8787"])
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.fixture(scope="module")
def carol(sim):
    """A guest running the real lab agent."""
    api = sim.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    source = (REPO / "guest/agent.py").read_text()
    core.create_namespaced_secret(
        "default", secret_manifest("carol-ci", agent_user_data(token="x" * 20, agent_source=source))
    )
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "virtualmachines", vm_manifest("carol", cloud_init_secret="carol-ci")
    )
    wait_for(lambda: (g := sim.admin.guest("default", "carol")) and g["ports"].get("8787"), what="carol up")
    yield sim.admin.guest("default", "carol")
    api.close()


def test_the_agent_sets_the_console_size_the_shell_sees(sim, guests, carol):
    # The agent's sandbox has the console's pty as /dev/ttyS0, as a VM's agent has its serial port.
    assert agent_post(carol, "/v1/tty-size", {"rows": 41, "cols": 157}) == (200, {"rows": 41, "cols": 157})
    assert "41 157" in run_in(sim, "carol", "stty size")
    # The shell respawned after exit reopens the same pty, which keeps its size and stays the agent's to set.
    first_shell = sim.admin.guest("default", "carol")["shell_pid"]
    ws = websocket.create_connection(
        f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/carol/console",
        header=[f"Authorization: Bearer {sim.token}"],
        subprotocols=["plain.kubevirt.io"],
        timeout=10,
    )
    ws.send_binary(b"exit\r")
    wait_for(lambda: sim.admin.guest("default", "carol")["shell_pid"] not in (None, first_shell), what="a new shell")
    ws.close()
    assert agent_post(carol, "/v1/tty-size", {"rows": 33, "cols": 99})[0] == 200
    assert "33 99" in run_in(sim, "carol", "stty size")
    # Another guest's console is untouched.
    assert "24 80" in run_in(sim, "bob", "stty size")
