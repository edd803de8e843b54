"""The shell guest (and the none guest's loopback line): a scratch root with cloud-init's ``write_files``, the lab
agent and a bash behind the serial console, each in a bubblewrap sandbox (``sandbox.py``); the serial line that
every guest kind shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import pty
import signal
import struct
import subprocess
import termios
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubesim import sandbox
from kubesim.cloudinit import CloudInitError, apply_write_files, unapplied, user_data_for

if TYPE_CHECKING:
    from kubesim.guests import GuestManager

log = logging.getLogger("kubesim.guest")

AGENT_GUEST_PORT = 8787
AGENT_DIR = "/etc/lab-agent"  # the agent's token (and what the portal's cloud-init puts beside it)
_PAUSE_ABOVE = 256  # queued output chunks before the serial line stops reading the pty
_RESUME_BELOW = 32


def _sessions_alive(sessions: set[int]) -> list[int]:
    """PIDs of every process in the given sessions (a shell's background jobs have process groups of their own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) in sessions:
            pids.append(int(entry))
    return pids


def kill_sessions(sessions: set[int]) -> None:
    for pid in _sessions_alive(sessions):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: guests are still cleaned up on every orderly exit
    _libc = None


def die_with_kubesim() -> None:
    """In the child before exec: get SIGKILL if kubesim itself is killed, so no guest outlives it."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _is_socket(path: Path) -> bool:
    return path.is_socket()


def _sandbox_user() -> dict[str, Any]:
    """Popen arguments that drop to the sandbox's unprivileged host user when kubesim is root."""
    uid = sandbox.host_uid()
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


class ConsoleClient:
    """One connected console: its output queue and a way to drop it without a close frame."""

    def __init__(self, abort: Callable[[], None]) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.abort = abort


class SerialLine:
    """The VMI's serial port: at most one client, input to the guest, output to that client."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest
        self.client: ConsoleClient | None = None
        self._paused = False

    def attach(self, client: ConsoleClient) -> ConsoleClient | None:
        previous, self.client = self.client, client
        self.guest.ensure_shell()
        return previous

    def detach(self, client: ConsoleClient) -> None:
        if self.client is client:
            self.client = None
            self._resume()

    def output(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return  # nobody on the line: a serial port drops what no one reads
        client.queue.put_nowait(data)
        if client.queue.qsize() > _PAUSE_ABOVE and not self._paused:
            self._paused = True
            self.guest.pause_output()

    def drained(self, client: ConsoleClient) -> None:
        if self._paused and client.queue.qsize() < _RESUME_BELOW:
            self._resume()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            self.guest.resume_output()

    def input(self, data: bytes) -> None:
        self.guest.write_input(data)

    def hang_up(self) -> None:
        """The guest went away: the client's connection drops, as virt-handler's does."""
        client, self.client = self.client, None
        if client is not None:
            client.abort()


class Guest:
    """One running VMI's guest."""

    def __init__(
        self, *, manager: GuestManager, vmi: dict[str, Any], root: Path | None, agent_after: float = 0.0
    ) -> None:
        meta = vmi["metadata"]
        self.manager = manager
        self.uid = meta["uid"]
        self.namespace = meta["namespace"]
        self.name = meta["name"]
        self.hostname = (vmi.get("spec") or {}).get("hostname") or self.name
        self.root = root
        self.home = root / "home" / "student" if root else None
        self.ports: dict[int, str] = {}  # guest port -> the Unix socket it is reached through
        self.serial = SerialLine(self)
        self.cloud_init_error: str | None = None
        # What the user data asked for that this guest did not do: said on the console as the shell first starts.
        self.cloud_init_skipped: list[str] = []
        self._boot_notice_shown = False
        self.shell: subprocess.Popen | None = None
        self.agent: subprocess.Popen | None = None
        self._master: int | None = None
        # The console's pty lives as long as the guest (a respawned shell reopens its slave), so that the agent's
        # sandbox can have it as /dev/ttyS0 from the start, as a VM's agent has its serial port.
        self._slave_path: str | None = None
        self._pending_input = bytearray()  # keystrokes the pty could not take yet
        self._agent_task: asyncio.Task | None = None
        self._agent_after = agent_after  # seconds of boot before systemd starts the lab agent (timing profiles)
        self.agent_dir: Path | None = None  # /etc/lab-agent, kept beside the guest's tree
        self._stopped = False

    # ---- boot --------------------------------------------------------------------------------------------
    def boot(self, vmi: dict[str, Any]) -> None:
        if self.root is None:
            return
        # Only HOME up front: directory operations are the dominant cost of a guest on overlay filesystems.
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            user_data = user_data_for(vmi, self.manager.store)
            if user_data:
                apply_write_files(self.root, user_data)
                self.cloud_init_skipped = unapplied(user_data)
        except (CloudInitError, OSError) as exc:
            self.cloud_init_error = str(exc)
            log.warning("guest %s/%s: cloud-init failed: %s", self.namespace, self.name, exc)
            (self.root / "var/log").mkdir(parents=True, exist_ok=True)
            (self.root / "var/log/cloud-init.log").write_text(f"cloud-init failed: {exc}\n")
        if self.cloud_init_skipped:
            log.info(
                "guest %s/%s: cloud-init steps not simulated: %s",
                self.namespace,
                self.name,
                "; ".join(self.cloud_init_skipped),
            )
        agent = self.root / "opt/lab-agent/agent.py"
        has_agent = agent.exists() and (self.root / AGENT_DIR.lstrip("/") / "token").exists()
        if has_agent:
            # cloud-init's last act: the marker the agent's unit waits for (--setup-marker).
            marker = self.root / "var/lib/cloud/instance/boot-finished"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("kubesim guest boot finished\n")
        sandbox.prepare_root(self.root, hostname=self.hostname)
        self._open_console_pty()
        if has_agent:
            # Out of the student's reach, bound into the agent's sandbox only (sandbox.py).
            self.agent_dir = sandbox.keep_apart(self.root, AGENT_DIR)
            token = Path(AGENT_DIR) / "token"
            if self._agent_after > 0:
                asyncio.get_running_loop().call_later(self._agent_after, self._spawn_agent, agent, token)
            else:
                self._spawn_agent(agent, token)

    def _spawn_agent(self, agent: Path, token: Path) -> None:
        """Start the lab agent in the sandbox as the guest's systemd unit would, on a Unix socket in the guest's
        /run (the sandbox has no network the host could reach): guest port 8787 leads there."""
        assert self.root is not None
        if self._stopped:
            return  # stopped while it booted
        agent_socket = self.root / "run/lab-agent.sock"
        with contextlib.suppress(FileNotFoundError):
            agent_socket.unlink()
        argv = [
            self.manager.config.guest_python,
            "/opt/lab-agent/agent.py",
            "--unix-socket",
            "/run/lab-agent.sock",
            "--token-file",
            "/etc/lab-agent/token",
            "--home",
            "/home/student",
            "--setup-marker",
            "/var/lib/cloud/instance/boot-finished",
        ]
        env = {
            "HOME": "/root",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
        }
        with open(self.root / "var/log/lab-agent.log", "ab") as log_file:
            try:
                self.agent = subprocess.Popen(
                    sandbox.command(
                        self.root,
                        argv,
                        user="root",
                        hostname=self.hostname,
                        cwd="/root",
                        binds=((self.agent_dir, AGENT_DIR),) if self.agent_dir else (),
                        devices={self._slave_path: "/dev/ttyS0"} if self._slave_path else None,
                    ),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,
                    preexec_fn=die_with_kubesim,
                    **_sandbox_user(),
                )
            except OSError as exc:
                log.warning("guest %s/%s: lab agent did not start: %s", self.namespace, self.name, exc)
                return
        self.manager.track(self.agent)
        self._agent_task = asyncio.get_running_loop().create_task(self._await_agent_socket(agent_socket))

    async def _await_agent_socket(self, agent_socket: Path) -> None:
        agent = self.agent
        assert agent is not None
        for _ in range(600):
            if self._stopped:
                return
            if _is_socket(agent_socket):
                self.ports[AGENT_GUEST_PORT] = str(agent_socket)
                return
            if agent.poll() is not None:
                log.warning("guest %s/%s: lab agent exited with %s", self.namespace, self.name, agent.returncode)
                return
            await asyncio.sleep(0.05)

    # ---- the shell behind the serial console -------------------------------------------------------------
    def ensure_shell(self) -> None:
        if self._stopped:
            return
        if self.shell is not None and self.shell.poll() is None:
            return
        if self.root is None:
            return  # guest mode none: the line is a loopback
        self._open_console_pty()
        if self._slave_path is None:
            return
        # Reopened for each shell; the master reads EIO once nothing has it open.
        slave = os.open(self._slave_path, os.O_RDWR | os.O_NOCTTY)
        env = {
            "HOME": "/home/student",
            "USER": "student",
            "LOGNAME": "student",
            "SHELL": "/bin/bash",
            "TERM": "vt220",
            "HOSTNAME": self.hostname,
            "LANG": "C.UTF-8",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PS1": f"student@{self.hostname}:\\w$ ",
            "HISTFILE": "/home/student/.bash_history",
        }

        def controlling_tty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            die_with_kubesim()

        argv = ["bash", "--noprofile", "--norc", "-i"]
        self.shell = subprocess.Popen(
            sandbox.command(self.root, argv, user="student", hostname=self.hostname),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=controlling_tty,
            close_fds=True,
            **_sandbox_user(),
        )
        os.close(slave)
        self.manager.track(self.shell)
        if not self._boot_notice_shown:
            # As a real guest's boot messages precede its login prompt on the serial console.
            self._boot_notice_shown = True
            notice = self._boot_notice()
            if notice:
                self.serial.output(notice)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._master, self._read_master)
        # Its exit is seen by its pid, not by the pty going quiet: the lab agent holds the console open once it has
        # sized it (as on a VM, where a serial line's size lasts only while something has it open).
        pidfd = os.pidfd_open(self.shell.pid)
        loop.add_reader(pidfd, self._shell_exited, pidfd)
        log.info("guest %s/%s: shell started (pid %s)", self.namespace, self.name, self.shell.pid)

    def _shell_exited(self, pidfd: int) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        # The shell exited (the student typed exit): a getty would respawn, so does kubesim, on the same pty.
        if self.shell is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                log.info("guest %s/%s: shell exited with %s", self.namespace, self.name, self.shell.wait(1))
        if self.serial.client is not None and not self._stopped:
            loop.call_later(0.1, self.ensure_shell)

    def _open_console_pty(self) -> None:
        if self._master is not None:
            return
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        if sandbox.host_uid() is not None:
            os.fchown(slave, sandbox.SANDBOX_UID, -1)  # the student's shell may set its own terminal modes
        self._slave_path = os.ttyname(slave)
        os.close(slave)
        os.set_blocking(master, False)
        self._master = master

    def _boot_notice(self) -> bytes:
        """The console's first lines when cloud-init did not do everything asked (empty otherwise)."""
        lines = []
        if self.cloud_init_error:
            lines.append(f"[kubesim] cloud-init failed: {self.cloud_init_error}")
        if self.cloud_init_skipped:
            lines.append("[kubesim] this simulated guest applies cloud-init write_files only; not done here:")
            lines += [f"[kubesim]   {step[:200]}" for step in self.cloud_init_skipped[:20]]
            if len(self.cloud_init_skipped) > 20:
                lines.append(f"[kubesim]   … and {len(self.cloud_init_skipped) - 20} more")
        return "".join(f"{line}\r\n" for line in lines).encode()

    def _read_master(self) -> None:
        if self._master is None:
            return
        try:
            data = os.read(self._master, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:
                log.warning("guest %s/%s: console read failed: %s", self.namespace, self.name, exc)
            data = b""
        if not data:
            # Nothing has the pty open any more (the shell's exit itself is seen by its pid); the next shell reads on.
            asyncio.get_running_loop().remove_reader(self._master)
            return
        self.serial.output(data)

    def pause_output(self) -> None:
        if self._master is not None:
            asyncio.get_running_loop().remove_reader(self._master)

    def resume_output(self) -> None:
        if self._master is not None:
            asyncio.get_running_loop().add_reader(self._master, self._read_master)

    def write_input(self, data: bytes) -> None:
        if self.root is None:
            self.serial.output(data)  # loopback line
            return
        if self.shell is None or self.shell.poll() is not None:
            self.ensure_shell()
        if self._master is None:
            return
        self._pending_input.extend(data)
        self._flush_input()

    def _flush_input(self) -> None:
        pending = self._pending_input
        loop = asyncio.get_running_loop()
        if self._master is None:
            pending.clear()
            return
        try:
            written = os.write(self._master, pending)
            del pending[:written]
        except BlockingIOError:
            pass
        except OSError:
            pending.clear()
            return
        if pending:
            loop.remove_writer(self._master)
            loop.add_writer(self._master, self._writable)
        else:
            loop.remove_writer(self._master)

    def _writable(self) -> None:
        self._flush_input()

    def _close_master(self) -> None:
        if self._master is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._master)
            loop.remove_writer(self._master)
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None

    async def open_port(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """A TCP connection to the guest's port (ConnectionRefusedError when nothing listens there)."""
        target = self.ports.get(port)
        if target is None:
            raise ConnectionRefusedError(f"guest port {port} refused the connection")
        reader, writer = await asyncio.open_unix_connection(str(target))
        return reader, writer, b""

    # ---- shutdown ----------------------------------------------------------------------------------------
    def sessions(self) -> set[int]:
        return {p.pid for p in (self.shell, self.agent) if p is not None}

    def stop(self) -> None:
        self._stopped = True
        self.serial.hang_up()
        if self._agent_task is not None:
            self._agent_task.cancel()
        self._close_master()
        for process in (self.shell, self.agent):
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "root": str(self.root) if self.root else None,
            "agent_dir": str(self.agent_dir) if self.agent_dir else None,
            "home": str(self.home) if self.home else None,
            "shell_pid": self.shell.pid if self.shell and self.shell.poll() is None else None,
            "agent_pid": self.agent.pid if self.agent and self.agent.poll() is None else None,
            "ports": {str(k): v for k, v in self.ports.items()},
            "cloud_init_error": self.cloud_init_error,
            "cloud_init_skipped": self.cloud_init_skipped,
            "console_connected": self.serial.client is not None,
        }
