"""virt-api's ``subresources.kubevirt.io``: start/stop/restart, pause, console, portforward and the guest-agent
reads, with virt-api's status codes, subprotocol echo, binary-only framing and console takeover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from kubesim.bodies import json_response, optional_json_object
from kubesim.controllers.objects import (
    VM,
    VMI,
    drop_condition,
    get_condition,
    new_condition,
    run_strategy,
    set_condition,
)
from kubesim.errors import ApiError
from kubesim.guest import ConsoleClient
from kubesim.resources import SUBRESOURCE_VERSIONS, resource_list

if TYPE_CHECKING:
    from kubesim.server import KubeSim, Route

log = logging.getLogger("kubesim.streams")
PROTOCOL = "plain.kubevirt.io"


def _vmi_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f'virtualmachineinstance.kubevirt.io "{name}" not found',
        details={"name": name, "group": "kubevirt.io", "kind": "virtualmachineinstance"},
    )


def _vm_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f'virtualmachine.kubevirt.io "{name}" not found',
        details={"name": name, "group": "kubevirt.io", "kind": "virtualmachine"},
    )


def _vm_conflict(name: str, message: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "{name}": {message}',
        details={"name": name, "group": "kubevirt.io", "kind": "virtualmachine"},
    )


async def dispatch(sim: KubeSim, request: web.Request, route: Route) -> web.StreamResponse:
    if route.version not in SUBRESOURCE_VERSIONS:
        raise ApiError(404, "the server could not find the requested resource")
    if not route.name:
        extra = route.extra
        if not extra:
            return json_response(resource_list("subresources.kubevirt.io", route.version))
        if extra == ("version",):
            version = ((sim.cluster.kubevirt() or {}).get("status") or {}).get(
                "observedKubeVirtVersion"
            ) or sim.config.kubevirt_version
            return json_response(
                {
                    "gitVersion": version,
                    "gitCommit": "kubesim",
                    "gitTreeState": "clean",
                    "buildDate": "2026-07-27T00:00:00Z",
                    "goVersion": "go1.24.6",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            )
        if extra in (("healthz",), ("guestfs",)):
            return json_response({"apiserver": "ok", "restclient": "ok"})
        raise ApiError(404, "the server could not find the requested resource")
    kind = route.resource.split("/")[0]
    sub = route.subresource
    if kind == "virtualmachines":
        if sub in ("start", "stop", "restart") and request.method == "PUT":
            return await _vm_state_change(sim, request, route.namespace, route.name, sub)
        if sub == "portforward" and request.method == "GET":
            vm = sim.store.get("virtualmachines", route.namespace, route.name)
            if vm is None:
                raise _vm_not_found(route.name)
            if not (vm.get("status") or {}).get("created"):
                raise ApiError(409, "VMI is not started")
            return await _portforward(sim, request, route.namespace, route.name, route.extra)
    elif kind == "virtualmachineinstances":
        if sub == "console" and request.method == "GET":
            return await _console(sim, request, route.namespace, route.name)
        if sub == "portforward" and request.method == "GET":
            return await _portforward(sim, request, route.namespace, route.name, route.extra)
        if sub in ("guestosinfo", "userlist", "filesystemlist") and request.method == "GET":
            return _guest_agent_read(sim, route.namespace, route.name, sub)
        if sub in ("pause", "unpause") and request.method == "PUT":
            return _pause(sim, route.namespace, route.name, paused=sub == "pause")
        if sub in ("vnc", "softreboot", "reset", "freeze", "unfreeze"):
            raise ApiError(400, f"{sub} is not simulated by kubesim")
    raise ApiError(404, "the server could not find the requested resource")


# ---- start / stop / restart ----------------------------------------------------------------------------------
async def _vm_state_change(sim: KubeSim, request: web.Request, namespace: str, name: str, action: str) -> web.Response:
    """lifecycle.go's Start/Stop/RestartVMRequestHandler: patch the run strategy or queue a state change."""
    options = await optional_json_object(request, what="request body (start/stop/restart options)")
    vm = sim.store.get("virtualmachines", namespace, name)
    if vm is None:
        raise _vm_not_found(name)
    dry_run = "All" in (options.get("dryRun") or [])
    strategy = run_strategy(vm)
    legacy = (vm.get("spec") or {}).get("running") is not None
    vmi = sim.store.get("virtualmachineinstances", namespace, name)
    phase = ((vmi or {}).get("status") or {}).get("phase", "")
    final = phase in ("Succeeded", "Failed")
    requests: list[dict[str, Any]] = []
    new_strategy: str | None = None
    if action == "start":
        if strategy == "Halted":
            new_strategy = "Always"
        elif strategy in ("RerunOnFailure", "Manual"):
            needs_restart = (strategy == "RerunOnFailure" and phase == "Succeeded") or (strategy == "Manual" and final)
            if strategy == "RerunOnFailure" and phase == "Failed":
                raise _vm_conflict(name, "RerunOnFailure does not support starting VM from failed state")
            if vmi is not None and not needs_restart and not final:
                raise _vm_conflict(name, "VM is already running")
            if needs_restart and vmi is not None:
                requests.append({"action": "Stop", "uid": vmi["metadata"]["uid"]})
            requests.append({"action": "Start"})
        else:
            raise _vm_conflict(name, f"{strategy} does not support manual start requests")
    elif action == "stop":
        grace = options.get("gracePeriod")
        if grace is not None and (not isinstance(grace, int) or grace < 0):
            raise ApiError(400, "gracePeriod must be a non-negative integer")
        if strategy in ("Halted", "RerunOnFailure", "Manual") and (vmi is None or final):
            raise _vm_conflict(name, "VM is not running")
        if strategy in ("Always", "Once"):
            new_strategy = "Halted"
        elif strategy in ("RerunOnFailure", "Manual"):
            requests.append({"action": "Stop", "uid": vmi["metadata"]["uid"]})
        if grace is not None and vmi is not None and not dry_run:
            sim.api.mutate(
                VMI, namespace, name, lambda o: o["spec"].__setitem__("terminationGracePeriodSeconds", grace)
            )
    else:  # restart
        grace = options.get("gracePeriodSeconds")
        if grace is not None and grace != 0:
            raise ApiError(400, "For force restart, only gracePeriod=0 is supported for now")
        if strategy == "Halted":
            raise _vm_conflict(name, "RunStategy Halted does not support manual restart requests")
        if vmi is None or (final and strategy != "Manual"):
            raise _vm_conflict(name, "VM is not running")
        requests = [{"action": "Stop", "uid": vmi["metadata"]["uid"]}, {"action": "Start"}]
    if dry_run:
        return web.Response(status=202)
    if new_strategy is not None:

        def patch(o: dict[str, Any]) -> None:
            if legacy:
                o["spec"]["running"] = new_strategy == "Always"
            else:
                o["spec"]["runStrategy"] = new_strategy
            o["metadata"]["generation"] = o["metadata"].get("generation", 1) + 1

        sim.api.mutate(VM, namespace, name, patch)
    if requests:

        def queue(o: dict[str, Any]) -> None:
            o.setdefault("status", {}).setdefault("stateChangeRequests", []).extend(requests)

        sim.api.mutate(VM, namespace, name, queue)
        if action == "restart" and options.get("gracePeriodSeconds") == 0 and vmi is not None:
            sim.api.delete(VMI, namespace, name, grace_period=0, internal=True)
    return web.Response(status=202)


def _pause(sim: KubeSim, namespace: str, name: str, *, paused: bool) -> web.Response:
    vmi = sim.store.get("virtualmachineinstances", namespace, name)
    if vmi is None:
        raise _vmi_not_found(name)
    if (vmi.get("status") or {}).get("phase") != "Running":
        raise ApiError(409, "VMI is not running")
    is_paused = get_condition(vmi, "Paused") is not None
    if paused and is_paused:
        raise ApiError(409, "VMI is already paused")
    if not paused and not is_paused:
        raise ApiError(409, "VMI is not paused")

    def write(o: dict[str, Any]) -> None:
        if paused:
            set_condition(o, new_condition("Paused", "True", "PausedByUser", "VMI was paused by user"))
        else:
            drop_condition(o, "Paused")

    sim.api.mutate(VMI, namespace, name, write)
    return web.Response(status=202)


# ---- guest agent reads ---------------------------------------------------------------------------------------
def _guest_agent_read(sim: KubeSim, namespace: str, name: str, what: str) -> web.Response:
    """virt-api answers these with HTTP 500 and a plain-text body when a precondition fails (reference §3)."""
    vmi = sim.store.get("virtualmachineinstances", namespace, name)
    if vmi is None:
        return web.Response(status=500, text=f'virtualmachineinstance.kubevirt.io "{name}" not found')
    status = vmi.get("status") or {}
    if status.get("phase") != "Running":
        return web.Response(status=500, text="VMI is not running")
    if get_condition(vmi, "AgentConnected") is None:
        return web.Response(status=500, text="VMI does not have guest agent connected")
    hostname = status.get("guestHostname") or (vmi.get("spec") or {}).get("hostname") or name
    login = time.time() - 60
    users = [{"userName": "student", "domain": "", "loginTime": login}]
    disks = [
        {
            "diskName": "vda1",
            "mountPoint": "/",
            "fileSystemType": "ext4",
            "usedBytes": 1_932_735_283,
            "totalBytes": 5_253_677_056,
            "disk": [{"busType": "virtio", "serial": "", "bus": 0}],
        }
    ]
    if what == "userlist":
        return json_response({"items": users})
    if what == "filesystemlist":
        return json_response({"items": disks})
    commands = [
        "guest-exec",
        "guest-info",
        "guest-ping",
        "guest-get-osinfo",
        "guest-get-users",
        "guest-get-fsinfo",
        "guest-network-get-interfaces",
        "guest-shutdown",
    ]
    return json_response(
        {
            "guestAgentVersion": "9.2.0",
            "supportedCommands": [{"name": c, "enabled": True} for c in commands],
            "hostname": hostname,
            "os": status.get("guestOSInfo") or {},
            "timezone": "UTC, 0",
            "userList": users,
            "fsInfo": {"disks": disks},
            "fsFreezeStatus": "thawed",
        }
    )


# ---- console -------------------------------------------------------------------------------------------------
def _running_vmi(sim: KubeSim, namespace: str, name: str) -> dict[str, Any]:
    vmi = sim.store.get("virtualmachineinstances", namespace, name)
    if vmi is None:
        raise _vmi_not_found(name)
    phase = (vmi.get("status") or {}).get("phase")
    if phase == "Failed":
        raise ApiError(409, "VMI is in failed status")
    if phase != "Running":
        raise ApiError(400, "VMI is not running")
    return vmi


def _websocket(request: web.Request) -> web.WebSocketResponse:
    # gorilla echoes plain.kubevirt.io when offered and accepts clients that offer none; never compresses.
    return web.WebSocketResponse(protocols=(PROTOCOL,), compress=False, autoping=True, max_msg_size=0)


class _Session:
    """An open console or portforward connection that kubesim may cut without a close frame."""

    def __init__(self, request: web.Request, namespace: str, name: str) -> None:
        self.transport = request.transport
        self.namespace = namespace
        self.name = name
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        if self.transport is not None:
            self.transport.abort()


async def _console(sim: KubeSim, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
    vmi = _running_vmi(sim, namespace, name)
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    if devices.get("autoattachSerialConsole") is False:
        raise ApiError(400, "No serial consoles are present.")
    guest = sim.guests.get(vmi["metadata"]["uid"])
    if guest is None:
        raise ApiError(500, "dialing virt-handler: the VMI's console is not available yet")
    ws = _websocket(request)
    if not ws.can_prepare(request).ok:
        raise ApiError(
            400,
            "websocket: the client is not using the websocket protocol: 'upgrade' token not "
            "found in 'Connection' header",
        )
    session = _Session(request, namespace, name)
    client = ConsoleClient(session.abort)
    await ws.prepare(request)
    previous = guest.serial.attach(client)
    if previous is not None:
        previous.abort()  # virt-handler closes the old stream: that client sees 1006
    sim.consoles.add(session)
    drop_timer = None
    if sim.faults.console_drop_after is not None:
        drop_timer = asyncio.get_running_loop().call_later(sim.faults.console_drop_after, session.abort)

    async def pump_output() -> None:
        while True:
            chunk = await client.queue.get()
            if chunk is None:
                return
            guest.serial.drained(client)
            await ws.send_bytes(chunk)

    sender = asyncio.create_task(pump_output())
    try:
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                guest.serial.input(message.data)
            # TEXT frames are dropped silently, exactly as virt-handler's binaryReader does.
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
        if drop_timer is not None:
            drop_timer.cancel()
        guest.serial.detach(client)
        sim.consoles.discard(session)
    return ws


# ---- portforward ---------------------------------------------------------------------------------------------
async def _portforward(
    sim: KubeSim, request: web.Request, namespace: str, name: str, extra: tuple[str, ...]
) -> web.StreamResponse:
    if not extra or not extra[0].isdigit() or len(extra) > 2:
        raise ApiError(404, "the server could not find the requested resource")
    port = int(extra[0])
    protocol = extra[1] if len(extra) > 1 else "tcp"
    if protocol not in ("tcp", "udp"):
        raise ApiError(400, f"unsupported protocol {protocol!r}")
    vmi = _running_vmi(sim, namespace, name)
    if get_condition(vmi, "Paused") is not None:
        raise ApiError(409, "VMI is paused")
    interfaces = (vmi.get("status") or {}).get("interfaces") or []
    if not interfaces:
        raise ApiError(400, "no network interfaces are present")
    ip = interfaces[0].get("ipAddress")
    guest = sim.guests.get(vmi["metadata"]["uid"])
    if guest is None or protocol != "tcp":
        raise ApiError(500, f"dialing VMI: dial {protocol} {ip}:{port}: connect: connection refused")
    try:
        reader, writer, first = await guest.open_port(port)
    except OSError as exc:
        raise ApiError(500, f"dialing VMI: dial {protocol} {ip}:{port}: connect: connection refused ({exc})") from exc
    ws = _websocket(request)
    if not ws.can_prepare(request).ok:
        writer.close()
        raise ApiError(400, "websocket: the client is not using the websocket protocol")
    session = _Session(request, namespace, name)
    await ws.prepare(request)
    sim.portforwards.add(session)

    async def guest_to_client() -> None:
        if first:
            await ws.send_bytes(first)
        while True:
            data = await reader.read(65536)
            if not data:
                return
            await ws.send_bytes(data)

    pump = asyncio.create_task(guest_to_client())
    receive = asyncio.create_task(_client_to_guest(ws, writer))
    try:
        await asyncio.wait({pump, receive}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pump, receive):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        writer.close()
        with contextlib.suppress(Exception):
            await ws.close()
        sim.portforwards.discard(session)
    return ws


async def _client_to_guest(ws: web.WebSocketResponse, writer: asyncio.StreamWriter) -> None:
    async for message in ws:
        if message.type == WSMsgType.BINARY:
            writer.write(message.data)
            await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()
