"""virt-api's subresources over real HTTP and WebSocket clients: console, portforward, guest-agent reads,
start/stop/restart."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import aiohttp
import pytest
import urllib3
import websocket

from kubesim.tests.support import (
    GROUP,
    VERSION,
    agent_user_data,
    condition,
    get_or_none,
    secret_manifest,
    vm_manifest,
    wait_for,
)

SUB = "/apis/subresources.kubevirt.io/v1/namespaces"
REAL_AGENT = Path(__file__).resolve().parents[2] / "guest" / "agent.py"


def _vmi(custom, namespace, name):
    return get_or_none(custom, namespace, "virtualmachineinstances", name)


def _running(custom, namespace, name, *, agent: bool = False):
    def ready():
        vmi = _vmi(custom, namespace, name)
        if not vmi or vmi.get("status", {}).get("phase") != "Running":
            return None
        if agent and condition(vmi, "AgentConnected") is None:
            return None
        return vmi

    return wait_for(ready, what=f"{name} Running")


def _start_vm(custom, namespace, name, **kwargs):
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest(name, namespace=namespace, **kwargs)
    )
    return _running(custom, namespace, name)


async def _read_until(ws: aiohttp.ClientWebSocketResponse, needle: bytes, *, within: float = 10) -> bytes:
    received = b""
    try:
        async with asyncio.timeout(within):
            while needle not in received:
                message = await ws.receive()
                if message.type != aiohttp.WSMsgType.BINARY:
                    raise AssertionError(f"unexpected {message.type} while waiting for {needle!r}; got {received!r}")
                received += message.data
    except TimeoutError as exc:
        raise AssertionError(f"no {needle!r} within {within}s; got {received!r}") from exc
    return received


def _console_url(sim, namespace, name):
    return f"{sim.ws_url}{SUB}/{namespace}/virtualmachineinstances/{name}/console"


async def test_console_handshake_errors_before_running_missing_and_failed(sim, custom, namespace):
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as missing:
            await session.ws_connect(_console_url(sim, namespace, "ghost"), protocols=("plain.kubevirt.io",))
        assert missing.value.status == 404
        # Too big to schedule: the VMI stays Pending, and the console says "not running" (400).
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("pending", namespace=namespace, memory="1Ti")
        )
        wait_for(lambda: _vmi(custom, namespace, "pending"), what="VMI")
        response = await session.get(_console_url(sim, namespace, "pending").replace("ws://", "http://"))
        assert response.status == 400
        assert (await response.json())["message"] == "VMI is not running"
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "virtualmachines",
            vm_manifest("crashy", namespace=namespace, run_strategy="Once"),
        )
        _running(custom, namespace, "crashy")
        sim.admin.fail_vmi(namespace, "crashy", reason="Crashed")
        with pytest.raises(aiohttp.WSServerHandshakeError) as failed:
            await session.ws_connect(_console_url(sim, namespace, "crashy"), protocols=("plain.kubevirt.io",))
        assert failed.value.status == 409


async def test_console_echoes_through_the_guest_shell_and_drops_text_frames(sim, custom, namespace):
    _start_vm(custom, namespace, "term")
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        ws = await session.ws_connect(_console_url(sim, namespace, "term"), protocols=("plain.kubevirt.io",))
        assert ws.protocol == "plain.kubevirt.io"
        assert "permessage-deflate" not in ws._response.headers.get("Sec-WebSocket-Extensions", "")
        await ws.send_bytes(b"\r")
        await _read_until(ws, b"student@term:~$ ")
        await ws.send_str("echo TEXT$((20+1))\r")  # dropped: KubeVirt reads binary frames only
        await ws.send_bytes(b"echo BIN$((40+2)); pwd; echo END$((1+1))\r")
        output = await _read_until(ws, b"END2")
        assert b"BIN42" in output and b"TEXT21" not in output
        assert b"\r\n/home/student\r\n" in output, "the shell starts in the guest's HOME, as the guest sees it"
        await ws.close()
        # The shell keeps its state between sessions (a serial line, not a new login).
        ws = await session.ws_connect(_console_url(sim, namespace, "term"), protocols=("plain.kubevirt.io",))
        await ws.send_bytes(b"X=kept; echo $X-$((1+1))\r")
        await _read_until(ws, b"kept-2")
        await ws.close()


async def test_the_console_first_says_which_cloud_init_steps_the_guest_did_not_do(sim, core, custom, namespace):
    user_data = agent_user_data(token="t" * 20).replace(
        "#cloud-config\n",
        "#cloud-config\nruncmd:\n- systemctl enable --now lab-agent.service\n"
        "- [apt-get, install, -y, tree]\npackages: [tree]\n",
        1,
    )
    core.create_namespaced_secret(namespace, secret_manifest("noted-ci", user_data))
    _start_vm(custom, namespace, "noted", cloud_init_secret="noted-ci")
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        ws = await session.ws_connect(_console_url(sim, namespace, "noted"), protocols=("plain.kubevirt.io",))
        await ws.send_bytes(b"\r")
        output = await _read_until(ws, b"student@noted:~$ ")
        notice = output.split(b"student@noted")[0].decode()
        assert "applies cloud-init write_files only" in notice
        assert "runcmd: apt-get install -y tree" in notice and "packages: tree" in notice
        assert "lab-agent" not in notice, "what kubesim simulates is not listed"
        await ws.close()
        # Said once, as boot messages are: a later session starts at the prompt.
        ws = await session.ws_connect(_console_url(sim, namespace, "noted"), protocols=("plain.kubevirt.io",))
        await ws.send_bytes(b"echo again-$((3+4))\r")
        assert b"kubesim" not in await _read_until(ws, b"again-7")
        await ws.close()
    assert sim.admin.guest(namespace, "noted")["cloud_init_skipped"] == [
        "runcmd: apt-get install -y tree",
        "packages: tree",
    ]


async def test_second_console_client_disconnects_the_first_with_1006(sim, custom, namespace):
    _start_vm(custom, namespace, "shared")
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        first = await session.ws_connect(_console_url(sim, namespace, "shared"), protocols=("plain.kubevirt.io",))
        await first.send_bytes(b"\r")
        await _read_until(first, b"$ ")
        second = await session.ws_connect(_console_url(sim, namespace, "shared"), protocols=("plain.kubevirt.io",))
        async with asyncio.timeout(5):
            while True:
                message = await first.receive()
                if message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.ERROR):
                    break
        assert message.type != aiohttp.WSMsgType.CLOSE, "no close frame: the connection just drops"
        assert first.close_code == 1006
        await second.send_bytes(b"echo still$((3*3))\r")
        await _read_until(second, b"still9")
        await second.close()


def test_console_accepts_a_client_without_subprotocol_and_websocket_client_binary(sim, custom, namespace):
    _start_vm(custom, namespace, "plain")
    url = _console_url(sim, namespace, "plain")
    ws = websocket.create_connection(
        url, header=[f"Authorization: Bearer {sim.token}"], subprotocols=["plain.kubevirt.io"], timeout=10
    )
    assert ws.getsubprotocol() == "plain.kubevirt.io"
    ws.send_binary(b"echo ws$((5*5))\r")
    received = b""
    while b"ws25" not in received:
        received += ws.recv()
    ws.close()
    bare = websocket.create_connection(url, header=[f"Authorization: Bearer {sim.token}"], timeout=10)
    assert bare.getsubprotocol() is None
    bare.close()


def _cloud_init_vm(custom, core, namespace, name, *, token, agent_source=None):
    user_data = agent_user_data(token=token, **({"agent_source": agent_source} if agent_source else {}))
    core.create_namespaced_secret(namespace, secret_manifest(f"{name}-ci", user_data))
    return _start_vm(custom, namespace, name, cloud_init_secret=f"{name}-ci")


async def _http_over_portforward(
    sim, namespace, name, request: bytes, *, port: int = 8787, kind: str = "virtualmachineinstances"
) -> bytes:
    url = f"{sim.ws_url}{SUB}/{namespace}/{kind}/{name}/portforward/{port}/tcp"
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        ws = await session.ws_connect(url, protocols=("plain.kubevirt.io",))
        await ws.send_bytes(request)
        response = b""
        async with asyncio.timeout(10):
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    response += message.data
        return response


async def test_portforward_reaches_the_agent_installed_by_cloud_init(sim, custom, core, namespace):
    _cloud_init_vm(custom, core, namespace, "graded", token="t0ken-for-the-agent")
    guest = wait_for(
        lambda: (g := sim.admin.guest(namespace, "graded")) and g["ports"].get("8787") and g, what="agent port"
    )
    # The token is kept beside the guest's tree, out of the student's reach (sandbox.py).
    token_file, agent_file = Path(guest["agent_dir"], "token"), Path(guest["root"], "opt/lab-agent/agent.py")
    assert token_file.read_text().strip() == "t0ken-for-the-agent"  # noqa: ASYNC240 - a tiny local file
    assert agent_file.stat().st_mode & 0o777 == 0o755  # noqa: ASYNC240
    answer = await _http_over_portforward(
        sim,
        namespace,
        "graded",
        b"GET /healthz HTTP/1.1\r\nHost: guest\r\nAuthorization: Bearer t0ken-for-the-agent\r\n\r\n",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    # Started as the guest's systemd starts it: root, in root's home inside the guest.
    assert json.loads(body) == {"ready": True, "home": "/root", "cwd": "/root"}
    denied = await _http_over_portforward(
        sim, namespace, "graded", b"GET /healthz HTTP/1.1\r\n\r\n", kind="virtualmachines"
    )
    assert denied.startswith(b"HTTP/1.0 401")
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{sim.ws_url}{SUB}/{namespace}/virtualmachineinstances/graded/portforward/22")
        assert refused.value.status == 500, "nothing listens on port 22 in the guest"


async def test_portforward_reaches_the_agent_of_a_guest_in_a_namespace_as_long_as_allowed(sim, custom, core):
    # A tenant's namespace can be this long (a DNS label): the agent's socket under the guest's directory must
    # still have a path a Unix socket can connect to (it had not: "AF_UNIX path too long", and no Start of a long
    # named institution's lab ever saw its agent answer).
    namespace = f"lab-{uuid.uuid4().hex[:6]}-{'a' * 63}"[:63]
    name = "attempt-1234567"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        _cloud_init_vm(custom, core, namespace, name, token="t0ken-for-the-long-agent")
        wait_for(lambda: (g := sim.admin.guest(namespace, name)) and g["ports"].get("8787"), what="agent port")
        answer = await _http_over_portforward(
            sim,
            namespace,
            name,
            b"GET /healthz HTTP/1.1\r\nHost: guest\r\nAuthorization: Bearer t0ken-for-the-long-agent\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
    finally:
        core.delete_namespace(namespace)


async def test_portforward_runs_a_check_through_the_real_guest_agent(sim, custom, core, namespace):
    _cloud_init_vm(
        custom, core, namespace, "real", token="real-agent-token-123456", agent_source=REAL_AGENT.read_text()
    )
    wait_for(
        lambda: (g := sim.admin.guest(namespace, "real")) and g["ports"].get("8787"), timeout=20, what="agent port"
    )
    body = json.dumps({"checks": [{"id": "home", "command": "cd ~ && pwd", "timeout_s": 5}]}).encode()
    answer = await _http_over_portforward(
        sim,
        namespace,
        "real",
        b"POST /v1/run HTTP/1.1\r\nHost: guest\r\n"
        b"Authorization: Bearer real-agent-token-123456\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
    )
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    result = json.loads(payload)["results"][0]
    assert result["exit_code"] == 0 and result["stdout"].strip() == "/home/student"


def test_guest_agent_reads_answer_500_plain_text_until_the_agent_connects(sim, custom, namespace):
    http = urllib3.PoolManager()

    def get(name, what="guestosinfo"):
        return http.request(
            "GET", f"{sim.url}{SUB}/{namespace}/virtualmachineinstances/{name}/{what}", headers=sim.auth_header()
        )

    missing = get("ghost")
    assert missing.status == 500 and missing.headers["Content-Type"].startswith("text/plain")
    assert missing.data.decode() == 'virtualmachineinstance.kubevirt.io "ghost" not found'
    sim.admin.configure(agent_delay=120)
    try:
        _start_vm(custom, namespace, "noagent")
    finally:
        sim.admin.configure(agent_delay=0)
    waiting = get("noagent")
    assert (waiting.status, waiting.data.decode()) == (500, "VMI does not have guest agent connected")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("stuck", namespace=namespace, memory="1Ti")
    )
    wait_for(lambda: _vmi(custom, namespace, "stuck"), what="VMI")
    assert (get("stuck").status, get("stuck").data.decode()) == (500, "VMI is not running")
    _start_vm(custom, namespace, "agent")
    _running(custom, namespace, "agent", agent=True)
    info = json.loads(get("agent").data)
    assert info["os"]["id"] == "fedora" and info["hostname"] == "agent"
    assert json.loads(get("agent", "userlist").data)["items"][0]["userName"] == "student"
    assert json.loads(get("agent", "filesystemlist").data)["items"][0]["mountPoint"] == "/"


def test_start_stop_restart_subresources(sim, custom, namespace):
    http = urllib3.PoolManager()

    def put(name, action, body=None):
        response = http.request(
            "PUT",
            f"{sim.url}{SUB}/{namespace}/virtualmachines/{name}/{action}",
            body=json.dumps(body) if body is not None else None,
            headers=sim.auth_header(),
        )
        return response.status, (json.loads(response.data) if response.data else None)

    assert put("ghost", "start")[0] == 404
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("life", namespace=namespace, run_strategy="Halted")
    )
    status, body = put("life", "restart")
    assert (status, body["message"]) == (
        409,
        'Operation cannot be fulfilled on virtualmachine.kubevirt.io "life": '
        "RunStategy Halted does not support manual restart requests",
    )
    assert put("life", "stop")[1]["message"].endswith("VM is not running")
    assert put("life", "start", {"dryRun": ["All"]}) == (202, None)
    assert (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", "life")["spec"]["runStrategy"]
        == "Halted"
    )
    assert put("life", "start") == (202, None)
    first = _running(custom, namespace, "life")
    assert (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", "life")["spec"]["runStrategy"]
        == "Always"
    )
    status, body = put("life", "start")
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"].endswith("Always does not support manual start requests")
    assert put("life", "restart", {"gracePeriodSeconds": 5})[0] == 400
    assert put("life", "restart") == (202, None)
    wait_for(
        lambda: (
            (_vmi(custom, namespace, "life") or {}).get("metadata", {}).get("uid")
            not in (None, first["metadata"]["uid"])
        ),
        what="restarted VMI",
    )
    _running(custom, namespace, "life")
    assert put("life", "stop") == (202, None)
    wait_for(lambda: _vmi(custom, namespace, "life") is None, what="stopped")
    vm = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", "life")
    assert vm["spec"]["runStrategy"] == "Halted"
    wait_for(
        lambda: (
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", "life")["status"][
                "printableStatus"
            ]
            == "Stopped"
        ),
        what="Stopped",
    )
    # Manual: start and stop become stateChangeRequests that the controller carries out.
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("manual", namespace=namespace, run_strategy="Manual")
    )
    assert put("manual", "start") == (202, None)
    _running(custom, namespace, "manual")
    assert put("manual", "start")[1]["message"].endswith("VM is already running")
    assert put("manual", "stop") == (202, None)
    wait_for(lambda: _vmi(custom, namespace, "manual") is None, what="manual stop")
    # The legacy field is patched instead of runStrategy.
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "virtualmachines",
        vm_manifest("legacy", namespace=namespace, run_strategy=None, running=False),
    )
    assert put("legacy", "start") == (202, None)
    assert (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", "legacy")["spec"].get(
            "running"
        )
        is True
    )
