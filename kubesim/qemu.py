"""QEMU for the ``vm`` guest: the accelerator probe, the command line, QMP and qemu-guest-agent clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubesim.quantity import parse_quantity

log = logging.getLogger("kubesim.qemu")

QEMU = "qemu-system-x86_64"
KERNEL_LINE = b"Linux version"


def qemu_available() -> bool:
    return shutil.which(QEMU) is not None


def probe_accelerator(probe_kernel: str) -> str:
    """'kvm' when a guest really runs under KVM here, else 'tcg'.

    Opening /dev/kvm is not enough: a nested host may create a VM and then refuse the guest's CPU features, so the
    probe boots the guest image's kernel and waits for its first line.
    """
    if not Path("/dev/kvm").exists() or not probe_kernel:
        return "tcg"
    with tempfile.TemporaryDirectory(prefix="kubesim-kvm-probe-") as scratch:
        out = Path(scratch) / "serial.log"
        command = [
            QEMU,
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "128",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            f"file:{out}",
            "-kernel",
            probe_kernel,
            "-append",
            "console=ttyS0 panic=-1",
            "-no-reboot",
        ]
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError:
            return "tcg"
        deadline = time.monotonic() + 5
        works = False
        while time.monotonic() < deadline and process.poll() is None:
            if out.exists() and KERNEL_LINE in out.read_bytes():
                works = True
                break
            time.sleep(0.1)
        process.kill()
        process.wait()
    return "kvm" if works else "tcg"


def accelerator_reason(accelerator: str) -> str:
    """Why the guests run under this accelerator, in a few words."""
    if accelerator == "kvm":
        return "a probe guest ran under KVM here"
    if not Path("/dev/kvm").exists():
        return "no /dev/kvm here: QEMU emulates the CPU (TCG)"
    return "/dev/kvm is here but a probe guest did not run under it: QEMU emulates the CPU (TCG)"


def vmi_size(vmi: dict[str, Any], *, max_cpus: int, max_memory_mib: int) -> tuple[int, int]:
    """vCPUs and guest memory (MiB) the VMI asks for, each capped when a cap is set (0: none)."""
    domain = (vmi.get("spec") or {}).get("domain") or {}
    cpu = domain.get("cpu") or {}
    cpus = max(1, int(cpu.get("cores", 1)) * int(cpu.get("sockets", 1)) * int(cpu.get("threads", 1)))
    memory = (
        (domain.get("memory") or {}).get("guest")
        or ((domain.get("resources") or {}).get("requests") or {}).get("memory")
        or "512Mi"
    )
    memory_mib = max(128, int(parse_quantity(str(memory)) / (1024 * 1024)))
    if max_cpus:
        cpus = min(cpus, max_cpus)
    if max_memory_mib:
        memory_mib = min(memory_mib, max_memory_mib)
    return cpus, memory_mib


def qemu_command(
    *, image: Path, root: Path, accel: str, cpus: int, memory_mib: int, forwards: dict[int, int]
) -> list[str]:
    """virt-launcher's domain as a QEMU command line: direct kernel boot, snapshot root disk, NoCloud seed."""
    hostfwd = "".join(f",hostfwd=tcp:127.0.0.1:{host}-:{guest}" for guest, host in forwards.items())
    # TCG's translation cache defaults to 1 GiB of RSS per guest; a quarter of it costs little boot time.
    accel_args = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg,tb-size=256"]
    return [
        QEMU,
        *accel_args,
        "-m",
        str(memory_mib),
        "-smp",
        str(cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-vga",
        "none",
        "-chardev",
        f"socket,id=ser0,path={root / 'console.sock'},server=on,wait=off,logfile={root / 'console.log'}",
        "-serial",
        "chardev:ser0",
        "-chardev",
        f"socket,id=qmp,path={root / 'qmp.sock'},server=on,wait=off",
        "-mon",
        "chardev=qmp,mode=control",
        "-device",
        "virtio-serial-pci",
        "-chardev",
        f"socket,id=qga0,path={root / 'qga.sock'},server=on,wait=off",
        "-device",
        "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        "-kernel",
        str(image / "vmlinuz"),
        "-initrd",
        str(image / "initrd.img"),
        "-append",
        "root=/dev/vda rw console=ttyS0",
        "-drive",
        f"file={image / 'root.img'},if=virtio,format=raw,snapshot=on",
        "-drive",
        f"file={root / 'seed.iso'},if=virtio,format=raw,readonly=on",
        "-netdev",
        f"user,id=n0{hostfwd}",
        "-device",
        "virtio-net-pci,netdev=n0",
    ]


class QmpClient:
    """QEMU's machine protocol over a Unix socket: commands answered in order, events to a callback."""

    def __init__(self, path: Path, *, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.path = path
        self.on_event = on_event
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: list[asyncio.Future] = []
        self._reader_task: asyncio.Task | None = None

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(str(self.path))
        await reader.readline()  # the greeting
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))
        await self.command("qmp_capabilities")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if "event" in message:
                    self.on_event(message)
                elif self._waiting:
                    future = self._waiting.pop(0)
                    if not future.done():
                        future.set_result(message)
        for future in self._waiting:
            if not future.done():
                future.set_exception(ConnectionError("QMP closed"))
        self._waiting.clear()

    async def command(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        if self._writer is None:
            raise ConnectionError("QMP not connected")
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        request: dict[str, Any] = {"execute": name}
        if arguments:
            request["arguments"] = arguments
        self._writer.write(json.dumps(request).encode() + b"\n")
        answer = await asyncio.wait_for(future, 10)
        if "error" in answer:
            raise RuntimeError(f"QMP {name}: {answer['error'].get('desc')}")
        return answer.get("return")

    def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


_OS_INFO_KEYS = {
    "id": "id",
    "name": "name",
    "pretty-name": "prettyName",
    "version": "version",
    "version-id": "versionId",
    "kernel-release": "kernelRelease",
    "kernel-version": "kernelVersion",
    "machine": "machine",
}


_AGENT_ANSWER_WITHIN = 2.0


async def guest_agent_os_info(path: Path) -> tuple[dict[str, str], str] | None:
    """Ask qemu-guest-agent for the OS info and hostname (as virt-handler does), or None if it is not answering."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return None
    try:
        sync_id = time.monotonic_ns() % 2**31
        # guest-sync flushes whatever an earlier, abandoned connection left in the channel.
        writer.write(json.dumps({"execute": "guest-sync", "arguments": {"id": sync_id}}).encode() + b"\n")
        while True:
            answer = json.loads(await asyncio.wait_for(reader.readline(), _AGENT_ANSWER_WITHIN) or b"{}")
            if answer.get("return") == sync_id:
                break
        replies = []
        for request in ("guest-get-osinfo", "guest-get-host-name"):
            writer.write(json.dumps({"execute": request}).encode() + b"\n")
            replies.append(json.loads(await asyncio.wait_for(reader.readline(), _AGENT_ANSWER_WITHIN))["return"])
    except (TimeoutError, ValueError, KeyError, OSError):
        return None
    finally:
        writer.close()
    os_info = {ours: str(replies[0][theirs]) for theirs, ours in _OS_INFO_KEYS.items() if theirs in replies[0]}
    return os_info, str(replies[1].get("host-name", ""))
