"""The ``vm`` guest: a real QEMU VM per running VMI, as virt-launcher runs one.

Kernel, initrd and root disk come from a local image (``guest/image/build``), the root disk as a snapshot like a
containerDisk; cloud-init reads a NoCloud seed made from the VMI's own user data; the serial console, QMP and
qemu-guest-agent are Unix sockets in the guest's directory; guest ports are forwarded by QEMU's user network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubesim.cloudinit import CloudInitError, user_data_for
from kubesim.guest import SerialLine, die_with_kubesim
from kubesim.qemu import QmpClient, guest_agent_os_info, qemu_command, vmi_size

if TYPE_CHECKING:
    from kubesim.guests import GuestManager

log = logging.getLogger("kubesim.vmguest")

AGENT_GUEST_PORT = 8787
_REFUSED_WINDOW = 0.3  # seconds to tell a port the guest refused from one it accepted


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VmGuest:
    """One running VMI's QEMU process, its serial line, its QMP and guest-agent channels."""

    def __init__(self, *, manager: GuestManager, vmi: dict[str, Any], root: Path, image: Path) -> None:
        meta = vmi["metadata"]
        self.manager = manager
        self.uid = meta["uid"]
        self.namespace = meta["namespace"]
        self.name = meta["name"]
        self.hostname = (vmi.get("spec") or {}).get("hostname") or self.name
        self.root = root
        self.image = image
        self.serial = SerialLine(self)
        self.ports: dict[int, int] = {}
        self.process: subprocess.Popen | None = None
        self.qmp: QmpClient | None = None
        self.powered_off = False
        self._console: socket.socket | None = None
        self._pending_input = bytearray()
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self._kill_timer: asyncio.TimerHandle | None = None
        self.cloud_init_error: str | None = None
        # KubeVirt's default for a VMI: 30 s between the ACPI power button and the kill.
        self.grace = float((vmi.get("spec") or {}).get("terminationGracePeriodSeconds", 30))

    # ---- boot --------------------------------------------------------------------------------------------
    def boot(self, vmi: dict[str, Any]) -> None:
        try:
            user_data = user_data_for(vmi, self.manager.store) or "#cloud-config\n{}\n"
        except CloudInitError as exc:
            self.cloud_init_error = str(exc)
            user_data = "#cloud-config\n{}\n"  # the guest boots without it, as KubeVirt's would with bad data
            log.warning("guest %s/%s: cloud-init user data unusable: %s", self.namespace, self.name, exc)
        self._write_seed(user_data)
        cpus, memory_mib = vmi_size(
            vmi, max_cpus=self.manager.config.guest_max_cpus, max_memory_mib=self.manager.config.guest_max_memory_mib
        )
        self.ports[AGENT_GUEST_PORT] = free_port()
        command = qemu_command(
            image=self.image,
            root=self.root,
            accel=self.manager.accelerator,
            cpus=cpus,
            memory_mib=memory_mib,
            forwards={AGENT_GUEST_PORT: self.ports[AGENT_GUEST_PORT]},
        )
        with open(self.root / "qemu.log", "ab") as qemu_log:
            # Started from the event loop's thread: the death signal follows the thread that forked, not the process.
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=qemu_log,
                stderr=qemu_log,
                start_new_session=True,
                preexec_fn=die_with_kubesim,
                cwd=self.root,
            )
        log.info(
            "guest %s/%s: QEMU pid %s (%s, %s vCPU, %s MiB)",
            self.namespace,
            self.name,
            self.process.pid,
            self.manager.accelerator,
            cpus,
            memory_mib,
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_process()))
        self._tasks.append(loop.create_task(self._attach_channels()))

    def _write_seed(self, user_data: str) -> None:
        seed = self.root / "seed"
        seed.mkdir(exist_ok=True)
        (seed / "user-data").write_text(user_data)
        (seed / "meta-data").write_text(f"instance-id: {self.uid}\nlocal-hostname: {self.hostname}\n")
        subprocess.run(
            [
                "genisoimage",
                "-quiet",
                "-output",
                str(self.root / "seed.iso"),
                "-volid",
                "cidata",
                "-joliet",
                "-rock",
                str(seed / "user-data"),
                str(seed / "meta-data"),
            ],
            check=True,
            capture_output=True,
        )

    async def _attach_channels(self) -> None:
        """Connect the serial console, QMP and the guest agent's channel once QEMU has made their sockets."""
        for _ in range(200):
            if self._stopped or (self.process and self.process.poll() is not None):
                return
            if all((self.root / name).exists() for name in ("console.sock", "qmp.sock", "qga.sock")):
                break
            await asyncio.sleep(0.05)
        console = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        console.connect(str(self.root / "console.sock"))
        console.setblocking(False)
        self._console = console
        asyncio.get_running_loop().add_reader(console, self._read_console)
        self.qmp = QmpClient(self.root / "qmp.sock", on_event=self._on_qmp_event)
        await self.qmp.connect()
        self._tasks.append(asyncio.get_running_loop().create_task(self._await_guest_agent()))

    def _on_qmp_event(self, event: dict[str, Any]) -> None:
        data = event.get("data") or {}
        if event.get("event") == "SHUTDOWN" and data.get("guest"):
            self.powered_off = True  # the guest powered itself off: QEMU exits next, and the VMI Succeeded

    async def _await_guest_agent(self) -> None:
        """qemu-guest-agent answering means AgentConnected, with the guest's own OS info and hostname."""
        while not self._stopped:
            info = await guest_agent_os_info(self.root / "qga.sock")
            if info is not None:
                self.manager.guest_agent_connected(self, os_info=info[0], hostname=info[1])
                return
            await asyncio.sleep(1.0)

    async def _watch_process(self) -> None:
        process = self.process
        assert process is not None
        await asyncio.get_running_loop().run_in_executor(None, process.wait)
        if self._stopped:
            return
        log.info(
            "guest %s/%s: QEMU exited with %s%s",
            self.namespace,
            self.name,
            process.returncode,
            " after a guest power-off" if self.powered_off else "",
        )
        self._close_console()
        self.serial.hang_up()
        self.manager.guest_exited(
            self, powered_off=self.powered_off and process.returncode == 0, code=process.returncode
        )

    # ---- the serial line ---------------------------------------------------------------------------------
    def ensure_shell(self) -> None:
        """The guest's getty is always there; nothing to start."""

    def _read_console(self) -> None:
        if self._console is None:
            return
        try:
            data = self._console.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_console()
            return
        self.serial.output(data)

    def pause_output(self) -> None:
        if self._console is not None:
            asyncio.get_running_loop().remove_reader(self._console)

    def resume_output(self) -> None:
        if self._console is not None:
            asyncio.get_running_loop().add_reader(self._console, self._read_console)

    def write_input(self, data: bytes) -> None:
        if self._console is None:
            return
        self._pending_input.extend(data)
        self._flush_input()

    def _flush_input(self) -> None:
        loop = asyncio.get_running_loop()
        if self._console is None:
            self._pending_input.clear()
            return
        try:
            sent = self._console.send(self._pending_input)
            del self._pending_input[:sent]
        except BlockingIOError:
            pass
        except OSError:
            self._pending_input.clear()
        loop.remove_writer(self._console)
        if self._pending_input:
            loop.add_writer(self._console, self._flush_input)

    def _close_console(self) -> None:
        if self._console is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._console)
            loop.remove_writer(self._console)
            self._console.close()
            self._console = None

    # ---- ports -------------------------------------------------------------------------------------------
    async def open_port(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """A TCP connection to the guest's port and what the guest said first (the server may speak first), or
        ConnectionRefusedError when the guest refuses it."""
        if port not in self.ports:
            if self.qmp is None:
                raise ConnectionRefusedError("the guest is not up yet")
            host_port = free_port()
            await self.qmp.command(
                "human-monitor-command", {"command-line": f"hostfwd_add tcp:127.0.0.1:{host_port}-:{port}"}
            )
            self.ports[port] = host_port
        reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[port])
        # QEMU's user network accepts on the host first and closes once the guest refuses: wait to see which. A
        # guest too busy to refuse within the window gives a connection that closes without a byte instead.
        try:
            first = await asyncio.wait_for(reader.read(65536), _REFUSED_WINDOW)
        except TimeoutError:
            return reader, writer, b""
        if not first:
            writer.close()
            raise ConnectionRefusedError(f"guest port {port} refused the connection")
        return reader, writer, first

    # ---- shutdown ----------------------------------------------------------------------------------------
    def stop(self, grace: float = 0.0) -> None:
        """ACPI power button, then SIGKILL after ``grace`` seconds (at once when 0)."""
        self._stopped = True
        self.serial.hang_up()
        self._close_console()
        for task in self._tasks:
            task.cancel()
        if self.process is None or self.process.poll() is not None:
            return
        if grace > 0 and self.qmp is not None:
            asyncio.get_running_loop().create_task(self.qmp.command("system_powerdown"))
            self._kill_timer = asyncio.get_running_loop().call_later(grace, self.kill)
        else:
            self.kill()

    def kill(self) -> None:
        if self.qmp is not None:
            self.qmp.close()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)

    def sessions(self) -> set[int]:
        return {self.process.pid} if self.process is not None else set()

    def describe(self) -> dict[str, Any]:
        alive = self.process is not None and self.process.poll() is None
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "root": str(self.root),
            "qemu_pid": self.process.pid if alive else None,
            "accelerator": self.manager.accelerator,
            "ports": {str(k): v for k, v in self.ports.items()},
            "cloud_init_error": self.cloud_init_error,
            "console_connected": self.serial.client is not None,
            "console_log": str(self.root / "console.log"),
        }
