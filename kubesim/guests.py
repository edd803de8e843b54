"""Every guest of a kubesim server: started when a VMI runs, stopped when it goes, all of them at exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kubesim import sandbox
from kubesim.config import SimConfig
from kubesim.guest import Guest, kill_sessions
from kubesim.store import Store

log = logging.getLogger("kubesim.guest")

# The longest path of a Unix socket under a guest's directory (the shell guest's agent; a vm guest's console, QMP
# and agent sockets are shorter), and the longest path a Unix socket can have (sun_path: 108 bytes with its NUL).
LONGEST_GUEST_SOCKET = "run/lab-agent.sock"
UNIX_PATH_MAX = 107
UID_CHARS = 8


def guest_root_name(base: Path, *, namespace: str, name: str, uid: str) -> str:
    """A guest's directory under ``base``: its namespace and name, cut short so that every socket under it has a
    path a Unix socket can take (a long tenant namespace left the agent unreachable: "AF_UNIX path too long"),
    and the first characters of its uid."""
    room = UNIX_PATH_MAX - len(f"{base}/_{uid[:UID_CHARS]}/{LONGEST_GUEST_SOCKET}")
    return f"{f'{namespace}_{name}'[: max(0, room)]}_{uid[:UID_CHARS]}"


def _sweep_orphaned_bases() -> None:
    """Remove guest directories left by a kubesim that was killed outright (its pid is in the name)."""
    for base in Path(tempfile.gettempdir()).glob("kubesim-guests-*-*"):
        pid_text = base.name.split("-")[2]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(base, ignore_errors=True)
        except PermissionError:
            continue  # alive, someone else's


def guest_images(specs: list[str]) -> dict[str, Path]:
    """``--guest-image`` values: ``DIR`` (the default image) or ``NAME=DIR`` (a containerDisk name's image)."""
    images: dict[str, Path] = {}
    for spec in specs:
        name, _, directory = spec.rpartition("=")
        path = Path(directory).expanduser()
        missing = [f for f in ("vmlinuz", "initrd.img", "root.img") if not (path / f).is_file()]
        if missing:
            raise ValueError(f"guest image {path} lacks {', '.join(missing)} (build one with guest/image/build)")
        images[name] = path
    if not images:
        raise ValueError("--guest vm needs --guest-image DIR (guest/image/build prints one)")
    return images


class GuestManager:
    """Every guest of the server, their scratch directories under one base directory, and their processes."""

    def __init__(self, *, config: SimConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.guests: dict[str, Any] = {}
        self.api: Any = None  # set by the server: guests report back (agent connected, QEMU gone) through it
        self.record: Any = None  # set by the server: the cluster's event recorder
        self.images: dict[str, Path] = {}
        self.accelerator = ""
        if config.guest == "shell" and not sandbox.bwrap_available():
            raise RuntimeError(
                "shell guests run in a bubblewrap sandbox: install bubblewrap (apt-get install "
                "bubblewrap), or use --guest none"
            )
        if config.guest in ("shell", "vm"):
            _sweep_orphaned_bases()
            self.base: Path | None = Path(tempfile.mkdtemp(prefix=f"kubesim-guests-{os.getpid()}-"))
            self.base.chmod(0o711)  # the sandbox's user passes through to its own guest, lists none
            if len(f"{self.base}/_{'u' * UID_CHARS}/{LONGEST_GUEST_SOCKET}") > UNIX_PATH_MAX:
                shutil.rmtree(self.base, ignore_errors=True)
                raise RuntimeError(
                    f"the guests' directory {self.base} is too long for the Unix sockets under it: "
                    "set TMPDIR to a shorter directory"
                )
        else:
            self.base = None
        self._shutting_down: list[Any] = []  # vm guests between the ACPI power button and the kill
        if config.guest == "vm":
            from kubesim.qemu import QEMU, accelerator_reason, probe_accelerator

            missing = [tool for tool in (QEMU, "genisoimage") if shutil.which(tool) is None]
            if missing:
                raise RuntimeError(
                    f"vm guests need {' and '.join(missing)} (apt-get install qemu-system-x86 genisoimage)"
                )

            self.images = guest_images(config.guest_images)
            default = self.images.get("", next(iter(self.images.values())))
            self.accelerator = probe_accelerator(str(default / "vmlinuz"))
            config.accelerator = self.accelerator
            config.accelerator_reason = accelerator_reason(self.accelerator)
            log.info("vm guests run under %s (%s)", self.accelerator.upper(), config.accelerator_reason)
        self._processes: list[subprocess.Popen] = []
        self._reaper: asyncio.TimerHandle | None = None

    @property
    def simulates_agent(self) -> bool:
        """Whether kubesim reports qemu-guest-agent itself (shell, none) or the guest's real one does (vm)."""
        return self.config.guest != "vm"

    def image_for(self, vmi: dict[str, Any]) -> Path:
        """The local image a VMI's containerDisk name maps to; the default image for any other name."""
        for volume in (vmi.get("spec") or {}).get("volumes") or ():
            name = (volume.get("containerDisk") or {}).get("image")
            if name in self.images:
                return self.images[name]
        return self.images.get("", next(iter(self.images.values())))

    def guest_agent_connected(self, guest: Any, *, os_info: dict[str, str], hostname: str) -> None:
        from kubesim.controllers.objects import VMI, new_condition, set_condition

        def connected(o: dict[str, Any]) -> None:
            if o["metadata"]["uid"] != guest.uid or (o.get("status") or {}).get("phase") != "Running":
                return
            set_condition(o, new_condition("AgentConnected", "True"))
            o["status"]["guestOSInfo"] = os_info
            o["status"]["guestHostname"] = hostname
            for interface in o["status"].get("interfaces") or ():
                interface["infoSource"] = "domain, guest-agent"

        self.api.mutate(VMI, guest.namespace, guest.name, connected)

    def guest_exited(self, guest: Any, *, powered_off: bool, code: int | None) -> None:
        """QEMU ended on its own: Succeeded after a guest power-off, Failed otherwise, as virt-handler reads the
        domain's Shutoff (reason Shutdown) or Crashed state (``pkg/virt-handler/vm.go``, ``calculateVmPhase...``):
        no ``status.reason``, a ``Stopped`` event saying which."""
        from kubesim.controllers.objects import VMI, drop_condition, new_condition, set_condition, set_phase

        ended_now = []

        def ended(o: dict[str, Any]) -> None:
            if o["metadata"]["uid"] != guest.uid or (o.get("status") or {}).get("phase") != "Running":
                return
            set_phase(o, "Succeeded" if powered_off else "Failed")
            set_condition(o, new_condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as running"))
            drop_condition(o, "AgentConnected")
            ended_now.append(True)

        vmi = self.api.mutate(VMI, guest.namespace, guest.name, ended)
        if ended_now and vmi is not None and self.record is not None:
            if powered_off:
                self.record(vmi, "Normal", "Stopped", "The VirtualMachineInstance was shut down.", "virt-handler")
            else:
                self.record(vmi, "Warning", "Stopped", "The VirtualMachineInstance crashed.", "virt-handler")

    def start(self, vmi: dict[str, Any], *, agent_after: float = 0.0) -> Guest:
        """The VMI's guest, booted; a shell guest's lab agent starts ``agent_after`` seconds later."""
        uid = vmi["metadata"]["uid"]
        existing = self.guests.get(uid)
        if existing is not None:
            return existing
        root = None
        if self.base is not None:
            meta = vmi["metadata"]
            root = self.base / guest_root_name(self.base, namespace=meta["namespace"], name=meta["name"], uid=uid)
            root.mkdir(parents=True, exist_ok=True)
        if self.config.guest == "vm":
            from kubesim.vmguest import VmGuest

            guest: Any = VmGuest(manager=self, vmi=vmi, root=root, image=self.image_for(vmi))
        else:
            guest = Guest(manager=self, vmi=vmi, root=root, agent_after=agent_after)
        self.guests[uid] = guest
        guest.boot(vmi)
        return guest

    def get(self, uid: str) -> Guest | None:
        return self.guests.get(uid)

    def stop(self, uid: str) -> None:
        guest = self.guests.pop(uid, None)
        if guest is None:
            return
        if self.config.guest == "vm":
            guest.stop(grace=guest.grace)  # ACPI power button, then killed after the grace period
            self._shutting_down = [g for g in self._shutting_down if g.process.poll() is None] + [guest]
            return
        guest.stop()
        sessions = guest.sessions()
        if sessions:
            kill_sessions(sessions)
        for tree in (guest.root, getattr(guest, "agent_dir", None)):
            if tree is not None:
                # Off the event loop: removing a directory tree is slow on overlay filesystems.
                asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, tree, True)

    def track(self, process: subprocess.Popen) -> None:
        self._processes.append(process)
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(1.0, self._reap)

    def _reap(self) -> None:
        """Collect exited guest processes so no zombies pile up."""
        self._processes = [p for p in self._processes if p.poll() is None]
        self._reaper = asyncio.get_running_loop().call_later(1.0, self._reap) if self._processes else None

    def shutdown(self) -> None:
        """Stop every guest: processes (whole sessions) killed, directories removed."""
        sessions: set[int] = set()
        for guest in [*self.guests.values(), *self._shutting_down]:
            guest.stop()
            sessions |= guest.sessions()
            if self.config.guest == "vm":
                guest.kill()
        self.guests.clear()
        if sessions:
            kill_sessions(sessions)
        for process in self._processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=2)
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
