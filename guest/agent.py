#!/usr/bin/env python3
"""In-guest grading agent: runs the portal's check commands and returns their output over HTTP + JSON. Standard
library only and one file, because cloud-init ships it as one ``write_files`` entry run by one ``ExecStart``
(its API and options: ``guest/README.md``); the portal, not the agent, decides pass or fail."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import fcntl
import hmac
import http.server
import json
import math
import os
import pathlib
import selectors
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from typing import Any

AGENT_VERSION = "1.0.0"

DEFAULT_PORT = 8787
DEFAULT_TOKEN_FILE = "/etc/lab-agent/token"
DEFAULT_HOME = "/home/student"
DEFAULT_MAX_CONCURRENT = 2
DEFAULT_CONSOLE_TTY = "/dev/ttyS0"  # the serial console whose size /v1/tty-size sets
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Request limits. The body cap is checked against Content-Length before a byte of the body is read.
MAX_BODY_BYTES = 256 * 1024
MAX_CHECKS = 100
MAX_ID_CHARS = 200
MAX_COMMAND_CHARS = 16 * 1024
MAX_TOKEN_CHARS = 128
MAX_TIMEOUT_S = 600.0

# Each output stream keeps this many bytes; the rest is read and dropped so that a chatty command never blocks.
OUTPUT_CAP_BYTES = 64 * 1024

# Between SIGTERM and SIGKILL for a check that ran out of time.
KILL_GRACE_S = 1.0
# How long to keep reading after the check's shell exits while background children still hold its pipes.
DRAIN_GRACE_S = 0.25
# Upper bound on one wait for output, so process exit and deadlines are noticed promptly.
POLL_INTERVAL_S = 0.05

RETRY_AFTER_S = 2
# Idle and slow-client bound on a connection's socket operations (not on how long checks may run).
SOCKET_TIMEOUT_S = 30.0


class RequestError(Exception):
    """A request the agent refuses; carries the HTTP status and a message for the JSON error body."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# ---------------------------------------------------------------------------------------------------------------
# Running checks


class CappedOutput:
    """Bytes of one output stream, keeping the first `cap` bytes and remembering whether more arrived."""

    def __init__(self, *, cap: int) -> None:
        self._cap = cap
        self._kept = bytearray()
        self.truncated = False

    def feed(self, data: bytes) -> None:
        room = self._cap - len(self._kept)
        self._kept += data[: max(room, 0)]
        self.truncated = self.truncated or len(data) > room

    def text(self) -> str:
        # When the cap cut through a multi-byte character, drop the partial tail instead of showing U+FFFD.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder.decode(bytes(self._kept), final=not self.truncated)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _has_exited(pid: int) -> bool:
    """Whether the child exited, without reaping it: its pid (and so its group id) cannot be recycled meanwhile."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def run_check(*, check_id: str, command: str, timeout_s: float, home: str, groups: set[int]) -> dict[str, Any]:
    """Run one check in its own process group, killed whole on timeout and when the shell exits, so that no
    background child outlives it or keeps its pipes open."""
    started = time.monotonic()
    stdout = CappedOutput(cap=OUTPUT_CAP_BYTES)
    stderr = CappedOutput(cap=OUTPUT_CAP_BYTES)
    exit_code = None
    timed_out = False
    try:
        proc = subprocess.Popen(
            [shutil.which("bash") or "/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=home,
            env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **os.environ, "HOME": home},
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        stderr.feed(f"agent: cannot start the check: {exc}".encode())
    else:
        pgid = proc.pid  # start_new_session makes the child the leader of a new session and process group
        groups.add(pgid)
        try:
            timed_out = _read_until_done(proc, stdout=stdout, stderr=stderr, deadline=started + timeout_s)
        finally:
            # The leader is still unreaped here, so its pgid cannot have been reused.
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
            groups.discard(pgid)
        if not timed_out:
            # Killed by a signal: reported the way a shell would.
            exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return {
        "id": check_id,
        "exit_code": exit_code,
        "stdout": stdout.text(),
        "stderr": stderr.text(),
        "duration_ms": int((time.monotonic() - started) * 1000),
        "timed_out": timed_out,
        "stdout_truncated": stdout.truncated,
        "stderr_truncated": stderr.truncated,
    }


def _read_until_done(
    proc: subprocess.Popen[bytes], *, stdout: CappedOutput, stderr: CappedOutput, deadline: float
) -> bool:
    """Read output until the shell exits and its pipes close, killing its group at the deadline; True on timeout."""
    pipes = {pipe.fileno(): (pipe, sink) for pipe, sink in ((proc.stdout, stdout), (proc.stderr, stderr)) if pipe}
    open_fds = set(pipes)
    selector = selectors.DefaultSelector()
    for fd in open_fds:
        selector.register(fd, selectors.EVENT_READ)
    # A pidfd wakes the loop the moment the shell exits; without one (Python < 3.9, old kernels) the loop polls.
    pidfd: int | None = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)
        selector.register(pidfd, selectors.EVENT_READ)
    longest_wait = 1.0 if pidfd is not None else POLL_INTERVAL_S

    def pump(until: float, *, until_exit: bool) -> bool:
        """Read output until ``until`` and the shell's exit (``until_exit``) or both pipes' end; whether it exited."""
        while True:
            exited = _has_exited(proc.pid)
            now = time.monotonic()
            if now >= until or (exited if until_exit else not open_fds):
                return exited
            # An empty epoll selector still waits out the timeout.
            for key, _ in selector.select(min(until - now, longest_wait)):
                if key.fd not in open_fds:
                    continue  # the pidfd: the exit is noticed at the top of the loop
                data = os.read(key.fd, 64 * 1024)
                if data:
                    pipes[key.fd][1].feed(data)
                else:
                    selector.unregister(key.fd)
                    open_fds.discard(key.fd)

    timed_out = False
    try:
        if not pump(deadline, until_exit=True):
            timed_out = True
            _signal_group(proc.pid, signal.SIGTERM)
            if not pump(time.monotonic() + KILL_GRACE_S, until_exit=True):
                _signal_group(proc.pid, signal.SIGKILL)
                pump(math.inf, until_exit=True)
        if pidfd is not None:
            selector.unregister(pidfd)  # readable from now on: it would wake every wait
        pump(time.monotonic() + DRAIN_GRACE_S, until_exit=False)
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
        for pipe, _sink in pipes.values():
            pipe.close()
    return timed_out


# ---------------------------------------------------------------------------------------------------------------
# Request validation


def json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError(400, "request body is not valid UTF-8") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "request body must be a JSON object")
    return payload


def parse_run_request(body: bytes) -> list[dict[str, Any]]:
    """Validate a /v1/run body and return its checks as run_check's arguments; unknown fields are ignored."""
    payload = json_object(body)
    if "checks" not in payload:
        raise RequestError(400, "missing field: checks")
    checks = payload["checks"]
    if not isinstance(checks, list):
        raise RequestError(400, "checks must be a list")
    if not checks:
        raise RequestError(400, "checks must not be empty")
    if len(checks) > MAX_CHECKS:
        raise RequestError(400, f"too many checks: {len(checks)} (at most {MAX_CHECKS})")

    parsed: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    for index, check in enumerate(checks):
        where = f"checks[{index}]"
        if not isinstance(check, dict):
            raise RequestError(400, f"{where} must be an object")
        for field in ("id", "command", "timeout_s"):
            if field not in check:
                raise RequestError(400, f"{where}: missing field: {field}")
        check_id, command, timeout_s = check["id"], check["command"], check["timeout_s"]
        if not isinstance(check_id, str) or not check_id or len(check_id) > MAX_ID_CHARS:
            raise RequestError(400, f"{where}.id must be a non-empty string of at most {MAX_ID_CHARS} characters")
        if check_id in seen_ids:
            raise RequestError(400, f"{where}.id is a duplicate: {check_id!r}")
        seen_ids.add(check_id)
        if not isinstance(command, str) or not command.strip():
            raise RequestError(400, f"{where}.command must be a non-empty string")
        if len(command) > MAX_COMMAND_CHARS:
            raise RequestError(
                400, f"{where}.command is too long: {len(command)} characters (at most {MAX_COMMAND_CHARS})"
            )
        if "\x00" in command:
            raise RequestError(400, f"{where}.command must not contain NUL characters")
        # The range refuses NaN and infinities (which Python's JSON reads) too.
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise RequestError(400, f"{where}.timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
        parsed.append({"check_id": check_id, "command": command, "timeout_s": float(timeout_s)})
    return parsed


def rotate_token(config: AgentConfig, body: bytes) -> None:
    """Replace the bearer token, in the token file first so that a restarted agent never has the old one."""
    token = json_object(body).get("token")
    if not isinstance(token, str) or not 16 <= len(token) <= MAX_TOKEN_CHARS or not token.isascii():
        raise RequestError(400, f"token must be 16 to {MAX_TOKEN_CHARS} ASCII characters")
    if not all(ch.isalnum() or ch in "-_." for ch in token):
        raise RequestError(400, "token may hold letters, digits, '-', '_' and '.' only")
    try:
        write_atomically(config.token_file, token + "\n")
    except OSError as exc:
        raise RequestError(500, f"cannot write the token file: {exc.strerror or exc}") from None
    config.token = token.encode("utf-8")


def parse_tty_size(body: bytes) -> tuple[int, int]:
    """Validate a /v1/tty-size body: {"rows": int, "cols": int}."""
    payload = json_object(body)
    size = []
    for field, (low, high) in (("rows", (2, 500)), ("cols", (2, 1000))):
        value = payload.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise RequestError(400, f"{field} must be an integer from {low} to {high}")
        size.append(value)
    return size[0], size[1]


# ---------------------------------------------------------------------------------------------------------------
# HTTP


@dataclasses.dataclass
class AgentConfig:
    """What the request handler needs to know; only the token changes (``/v1/token``)."""

    token: bytes
    token_file: str
    home: str | None  # None: resolved per run, so an agent started before the student's home exists uses it
    setup_marker: str | None
    console_tty: str
    run_slots: threading.BoundedSemaphore
    # Process groups of the running checks, killed when the agent stops; set operations are atomic across threads.
    groups: set[int] = dataclasses.field(default_factory=set)
    # The console as last sized, held open: a serial line's size lasts only while something has it open, and a
    # logout closes everything else (the next login would start at 80x24).
    console_fd: int | None = None
    console_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def resolve_default_home() -> str:
    if os.path.isdir(DEFAULT_HOME):
        return DEFAULT_HOME
    with contextlib.suppress(RuntimeError, KeyError):
        home = str(pathlib.Path.home())  # $HOME, else the password database's
        if os.path.isdir(home):
            return home
    return "/"


ROUTES = {"/healthz": "GET", "/v1/run": "POST", "/v1/token": "POST", "/v1/tty-size": "POST"}


class AgentHandler(http.server.BaseHTTPRequestHandler):
    """One HTTP/1.1 connection; requests are answered with JSON, errors included."""

    protocol_version = "HTTP/1.1"
    server_version = f"lab-agent/{AGENT_VERSION}"
    timeout = SOCKET_TIMEOUT_S
    config: AgentConfig  # set on the subclass built by main

    def _handle(self) -> None:
        self._started = time.monotonic()
        self._note = ""
        self._body_read = False
        try:
            self._authenticate()
            path = self.path.split("?", 1)[0]
            method = ROUTES.get(path)
            if method is None:
                raise RequestError(404, f"no such endpoint: {path}")
            if self.command != method:
                raise RequestError(405, f"method {self.command} not allowed on {path}", headers={"Allow": method})
            if path == "/healthz":
                setup_finished = self.config.setup_marker is None or os.path.exists(self.config.setup_marker)
                self._send_json(200, {"ready": True, "version": AGENT_VERSION, "setup_finished": setup_finished})
            elif path == "/v1/token":
                rotate_token(self.config, self._read_body())
                self._send_json(200, {"rotated": True})
            elif path == "/v1/tty-size":
                self._set_tty_size()
            else:
                self._run_checks()
        except RequestError as exc:
            if ("Content-Length" in self.headers or "Transfer-Encoding" in self.headers) and not self._body_read:
                # An unread body would be taken for the next request on this connection.
                self.close_connection = True
            self._send_json(exc.status, {"error": str(exc)}, headers=exc.headers)
        except Exception as exc:
            # A bug must answer 500 JSON rather than drop the connection without a word.
            self._note = f"internal error: {type(exc).__name__}"
            self.close_connection = True
            self._send_json(500, {"error": f"internal agent error: {type(exc).__name__}"})

    # Every method is dispatched the same way, so that a wrong one gets 405 JSON with ``Allow``.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

    def _authenticate(self) -> None:
        scheme, _, presented = self.headers.get("Authorization", "").partition(" ")
        # Compare even when the scheme is wrong so that timing does not reveal which part was at fault.
        candidate = presented.strip().encode("latin-1", errors="replace")
        matches = hmac.compare_digest(candidate, self.config.token)
        if scheme.lower() != "bearer" or not matches:
            raise RequestError(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    def _read_body(self) -> bytes:
        # A refused body is left unread, and _handle closes the connection for it.
        if "Transfer-Encoding" in self.headers:
            raise RequestError(411, "chunked bodies are not supported; send Content-Length")
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            self.close_connection = True
            raise RequestError(411, "Content-Length is required")
        try:
            length = int(raw_length)
        except ValueError:
            length = -1
        if length < 0:
            raise RequestError(400, "Content-Length is not a valid length")
        if length > MAX_BODY_BYTES:
            raise RequestError(413, f"request body too large: {length} bytes (at most {MAX_BODY_BYTES})")
        body = self.rfile.read(length)
        self._body_read = True
        if len(body) != length:
            self.close_connection = True
            raise RequestError(400, "request body shorter than Content-Length")
        return body

    def _run_checks(self) -> None:
        checks = parse_run_request(self._read_body())
        if not self.config.run_slots.acquire(blocking=False):
            raise RequestError(
                429, "too many runs in progress; retry later", headers={"Retry-After": str(RETRY_AFTER_S)}
            )
        try:
            home = self.config.home or resolve_default_home()
            results = [run_check(**check, home=home, groups=self.config.groups) for check in checks]
        finally:
            self.config.run_slots.release()
        self._note = f"checks={len(results)} timed_out={sum(r['timed_out'] for r in results)}"
        self._send_json(200, {"results": results})

    def _set_tty_size(self) -> None:
        rows, cols = parse_tty_size(self._read_body())
        tty = self.config.console_tty
        try:
            # ``stty -F tty rows R cols C``: the kernel tells the terminal's foreground job (SIGWINCH).
            fd = os.open(tty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            try:
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            raise RequestError(503, f"cannot set the size of {tty}: {exc.strerror or exc}") from None
        with self.config.console_lock:
            held, self.config.console_fd = self.config.console_fd, fd
        if held is not None:
            os.close(held)
        self._note = f"tty={rows}x{cols}"
        self._send_json(200, {"rows": rows, "cols": cols})

    # -- responses and logging -----------------------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict[str, Any], *, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response_only(status)
        self.send_header("Server", self.server_version)  # without the base class's Python version
        self.send_header("Date", self.date_time_string())
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log_request_line(status, len(body))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors the base class detects itself (bad request line, oversized headers): JSON like every other."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            # The base class assumes HTTP/0.9 (no status line, no headers) for a line it cannot parse; no
            # client of the agent speaks 0.9, so answer in a form that every client can read.
            self.request_version = "HTTP/1.0"
        self._started = getattr(self, "_started", time.monotonic())
        self._note = ""
        self.command = getattr(self, "command", None) or ""
        self._send_json(code, {"error": message or http.HTTPStatus(code).phrase})

    def _log_request_line(self, status: int, size: int) -> None:
        elapsed_ms = int((time.monotonic() - self._started) * 1000)
        method = _printable(self.command or "-", limit=16)
        path = _printable(getattr(self, "path", "") or "-", limit=200)  # unset when the request line was refused
        note = f" {self._note}" if self._note else ""
        client = self.client_address[0] if self.client_address else "-"
        _log(f'{client} "{method} {path}" {status} {size}B {elapsed_ms}ms{note}')

    def log_message(self, fmt: str, *args: Any) -> None:
        # Requests are logged by _log_request_line; the base class's own messages may quote raw request bytes,
        # so they are reduced to printable text and never include headers.
        _log(_printable(fmt % args, limit=300))


def _printable(text: str, *, limit: int) -> str:
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in text)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def _log(line: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    print(f"{stamp} {line}", file=sys.stderr, flush=True)


class AgentServer(http.server.ThreadingHTTPServer):  # daemon threads and address reuse are its defaults
    request_queue_size = 64


class AgentServer6(AgentServer):
    address_family = socket.AF_INET6


class UnixAgentServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The agent on a Unix socket: for a sandbox without a network of its own that its host could reach."""

    daemon_threads = True
    request_queue_size = 64


# ---------------------------------------------------------------------------------------------------------------
# Start-up


def read_token(path: str) -> str:
    try:
        token = pathlib.Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SystemExit(f"lab-agent: cannot read the token file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SystemExit(f"lab-agent: the token file {path} is not UTF-8 text") from None
    if not token:
        raise SystemExit(f"lab-agent: the token file {path} is empty")
    return token


def write_atomically(path: str, text: str) -> None:
    """Replace the file in one step, so a reader never sees it half written."""
    fd, tmp_path = tempfile.mkstemp(prefix=".agent-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Lab grading agent: runs check commands for the portal.")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port; 0 picks a free one")
    parser.add_argument("--token-file", default=DEFAULT_TOKEN_FILE, help="file holding the bearer token")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
    parser.add_argument("--home", help=f"working directory and HOME for checks (default {DEFAULT_HOME}, else $HOME)")
    parser.add_argument(
        "--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT, help="runs allowed at once; more get 429"
    )
    parser.add_argument("--setup-marker", help="file whose existence means guest setup finished (e.g. cloud-init's)")
    parser.add_argument("--console-tty", default=DEFAULT_CONSOLE_TTY, help="the serial console /v1/tty-size resizes")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    if args.max_concurrent < 1:
        parser.error("--max-concurrent must be at least 1")
    if args.home is not None and not os.path.isdir(args.home):
        parser.error(f"--home {args.home} is not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = AgentConfig(
        token=read_token(args.token_file).encode("utf-8"),
        token_file=args.token_file,
        home=args.home,
        setup_marker=args.setup_marker,
        console_tty=args.console_tty,
        run_slots=threading.BoundedSemaphore(args.max_concurrent),
    )
    handler = type("ConfiguredAgentHandler", (AgentHandler,), {"config": config})
    try:
        if args.unix_socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.unix_socket)
            server: AgentServer | UnixAgentServer = UnixAgentServer(args.unix_socket, handler)
        else:
            server_class = AgentServer6 if ":" in args.host else AgentServer
            server = server_class((args.host, args.port), handler)
    except OSError as exc:
        where = args.unix_socket or f"{args.host}:{args.port}"
        raise SystemExit(f"lab-agent: cannot listen on {where}: {exc.strerror or exc}") from None

    # A requested stop is a clean exit (systemd counts a non-zero status as a failure).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: sys.exit(0))

    where = args.unix_socket
    if where is None:
        port = int(server.server_address[1])  # type: ignore[index]  # a TCP server's address: (host, port[, ...])
        where = f"{args.host}:{port}"
        if args.port_file:
            write_atomically(args.port_file, f"{port}\n")
    _log(
        f"lab-agent {AGENT_VERSION} listening on {where}, "
        f"home {args.home or resolve_default_home()}, max concurrent runs {args.max_concurrent}"
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        for pgid in config.groups.copy():
            _signal_group(pgid, signal.SIGKILL)
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
