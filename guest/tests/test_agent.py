"""Tests for the in-guest grading agent, started as a real subprocess and spoken to over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guest import agent as agent_module

AGENT_PATH = Path(agent_module.__file__)
TOKEN = "t0ken-for-tests-4f9c2a"
# The agent must run on the guests' older interpreters too; point this at one to check.
AGENT_PYTHON = os.environ.get("LAB_AGENT_TEST_PYTHON", sys.executable)

pytestmark = pytest.mark.timeout(60)


@dataclass
class RunningAgent:
    port: int
    home: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        token: str | None = TOKEN,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, http.client.HTTPResponse, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            all_headers = dict(headers or {})
            if token is not None:
                all_headers["Authorization"] = f"Bearer {token}"
            if body is not None:
                all_headers.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            raw = response.read()
            assert response.getheader("Content-Type", "").startswith("application/json")
            return response.status, response, json.loads(raw)
        finally:
            conn.close()

    def run(self, checks: list[dict[str, Any]], **kwargs: Any) -> tuple[int, Any]:
        status, _, payload = self.request("POST", "/v1/run", body=json.dumps({"checks": checks}).encode(), **kwargs)
        return status, payload

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _start(directory: Path, *extra_args: str) -> RunningAgent:
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "token"
    token_file.write_text(f"  {TOKEN}\n", encoding="utf-8")  # surrounding whitespace must be stripped
    home = directory / "home"
    home.mkdir(exist_ok=True)
    port_file = directory / "port"
    log_path = directory / "agent.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                AGENT_PYTHON,
                str(AGENT_PATH),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--token-file",
                str(token_file),
                "--port-file",
                str(port_file),
                "--home",
                str(home),
                *extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 10
    while not port_file.exists():
        if proc.poll() is not None:
            pytest.fail(f"agent exited with {proc.returncode}: {log_path.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("agent did not write its port file within 10 s")
        time.sleep(0.02)
    return RunningAgent(port=int(port_file.read_text()), home=home, log_path=log_path, proc=proc)


def _stop(agent: RunningAgent) -> None:
    agent.proc.terminate()
    try:
        agent.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    started: list[RunningAgent] = []

    def start(*extra_args: str) -> RunningAgent:
        running = _start(tmp_path / f"agent{len(started)}", *extra_args)
        started.append(running)
        return running

    yield start
    for running in started:
        _stop(running)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    """One agent shared by the tests that leave no state behind."""
    running = _start(tmp_path_factory.mktemp("agent"))
    yield running
    _stop(running)


def _check(check_id: str, command: str, timeout_s: float = 10) -> dict[str, Any]:
    return {"id": check_id, "command": command, "timeout_s": timeout_s}


def _process_gone(pid: int, *, within: float = 3.0) -> bool:
    """True once the process no longer exists or is a zombie (dead, awaiting its reaper)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# --- health and authentication ----------------------------------------------------------------------------------


def test_healthz_reports_ready_version_and_setup_state(
    start_agent: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    marker = tmp_path / "boot-finished"
    running = start_agent("--setup-marker", str(marker))

    status, _, body = running.request("GET", "/healthz")
    assert status == 200
    assert body == {"ready": True, "version": agent_module.AGENT_VERSION, "setup_finished": False}

    marker.write_text("done")
    status, _, body = running.request("GET", "/healthz")
    assert status == 200
    assert body["setup_finished"] is True


def test_healthz_without_a_marker_counts_setup_as_finished(agent: RunningAgent) -> None:
    status, _, body = agent.request("GET", "/healthz")
    assert status == 200
    assert body["ready"] is True
    assert body["setup_finished"] is True


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer ünïcode"},
    ],
    ids=["missing", "longer", "shorter", "basic-scheme", "no-scheme", "empty", "non-ascii"],
)
def test_requests_without_the_right_token_get_401(agent: RunningAgent, headers: dict[str, str]) -> None:
    for method, path, body in (
        ("GET", "/healthz", None),
        ("POST", "/v1/run", json.dumps({"checks": [_check("a", "touch should-not-exist")]}).encode()),
        ("GET", "/no-such-path", None),
    ):
        status, response, payload = agent.request(method, path, body=body, token=None, headers=headers)
        assert status == 401, (method, path)
        assert response.getheader("WWW-Authenticate") == "Bearer"
        assert "token" in payload["error"]
    assert not (agent.home / "should-not-exist").exists()


def test_bearer_scheme_is_case_insensitive(agent: RunningAgent) -> None:
    status, _, _ = agent.request("GET", "/healthz", token=None, headers={"Authorization": f"bearer {TOKEN}"})
    assert status == 200


def test_each_request_is_logged_on_one_line_without_the_token(agent: RunningAgent) -> None:
    agent.request("GET", "/healthz")
    agent.request("GET", "/healthz", token="wrong-token")
    agent.run([_check("logged", "true")])
    time.sleep(0.1)
    log = agent.log()
    assert '"GET /healthz" 200' in log
    assert '"GET /healthz" 401' in log
    assert '"POST /v1/run" 200' in log
    assert TOKEN not in log
    assert "wrong-token" not in log


# --- running checks ---------------------------------------------------------------------------------------------


def test_results_come_back_in_order_with_exit_codes_output_and_durations(agent: RunningAgent) -> None:
    status, body = agent.run(
        [
            _check("first", "echo hello"),
            _check("fails", "echo oops >&2; exit 3"),
            # Sequential execution: "later" only sees the file that "slow" creates after its sleep.
            _check("slow", "sleep 0.3; touch slow-done"),
            _check("later", 'test -e slow-done && rm slow-done && echo "$PWD $HOME"'),
            _check("signalled", "kill -KILL $$"),
        ]
    )
    assert status == 200
    results = body["results"]
    assert [r["id"] for r in results] == ["first", "fails", "slow", "later", "signalled"]

    first, fails, slow, later, signalled = results
    assert first["exit_code"] == 0
    assert first["stdout"] == "hello\n"
    assert first["stderr"] == ""
    assert fails["exit_code"] == 3
    assert fails["stderr"] == "oops\n"
    assert slow["exit_code"] == 0
    assert 300 <= slow["duration_ms"] < 3000
    assert later["exit_code"] == 0
    assert later["stdout"] == f"{agent.home} {agent.home}\n"
    assert signalled["exit_code"] == 128 + 9  # reported the way a shell reports a signal death
    for result in results:
        assert set(result) == {
            "id",
            "exit_code",
            "stdout",
            "stderr",
            "duration_ms",
            "timed_out",
            "stdout_truncated",
            "stderr_truncated",
        }
        assert result["timed_out"] is False
        assert result["stdout_truncated"] is False
        assert result["stderr_truncated"] is False
        assert isinstance(result["duration_ms"], int) and result["duration_ms"] >= 0


def test_unknown_fields_are_ignored(agent: RunningAgent) -> None:
    payload = {"checks": [{**_check("a", "echo ok"), "expect": "ok", "points": 3}], "attempt": 12}
    status, _, body = agent.request("POST", "/v1/run", body=json.dumps(payload).encode())
    assert status == 200
    assert body["results"][0]["stdout"] == "ok\n"
    assert set(body["results"][0]) >= {"id", "exit_code"}
    assert "expect" not in body["results"][0]


def test_a_check_cannot_read_the_request_from_stdin(agent: RunningAgent) -> None:
    status, body = agent.run([_check("stdin", "cat; echo end", timeout_s=5)])
    assert status == 200
    assert body["results"][0]["stdout"] == "end\n"
    assert body["results"][0]["timed_out"] is False


def test_timeout_kills_the_whole_process_group(agent: RunningAgent) -> None:
    status, body = agent.run(
        [
            _check("hangs", "sleep 60 & echo $! > bg-child.pid; echo started; sleep 60", timeout_s=1),
            _check("after", "echo next"),
        ]
    )
    assert status == 200
    hangs, after = body["results"]
    assert hangs["timed_out"] is True
    assert hangs["exit_code"] is None
    assert hangs["stdout"] == "started\n"  # output produced before the timeout is kept
    assert 1000 <= hangs["duration_ms"] < 4000
    child_pid = int((agent.home / "bg-child.pid").read_text())
    assert _process_gone(child_pid), "the background child of a timed-out check survived"
    # The run carries on with the next check after a timeout.
    assert after["exit_code"] == 0
    assert after["stdout"] == "next\n"


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored(agent: RunningAgent) -> None:
    # Ignored signals stay ignored across fork and exec, so the background sleep ignores SIGTERM as well.
    command = "trap '' TERM; sleep 60 & echo $! > stubborn.pid; while :; do sleep 0.1; done"
    status, body = agent.run([_check("stubborn", command, timeout_s=0.5)])
    assert status == 200
    result = body["results"][0]
    assert result["timed_out"] is True
    assert result["exit_code"] is None
    assert 500 + agent_module.KILL_GRACE_S * 1000 <= result["duration_ms"] < 5000
    assert _process_gone(int((agent.home / "stubborn.pid").read_text()))


def test_background_children_do_not_outlive_a_finished_check(agent: RunningAgent) -> None:
    started = time.monotonic()
    status, body = agent.run([_check("forks", "sleep 60 & echo $! > leftover.pid; echo done")])
    assert status == 200
    result = body["results"][0]
    assert result["exit_code"] == 0
    assert result["stdout"] == "done\n"
    assert result["timed_out"] is False
    # The sleep holds the output pipe open; the agent must not wait for it (60 s), however loaded the machine.
    assert time.monotonic() - started < 30
    assert _process_gone(int((agent.home / "leftover.pid").read_text()))


def test_output_is_capped_and_marked_truncated(agent: RunningAgent) -> None:
    cap = agent_module.OUTPUT_CAP_BYTES
    # A megabyte on stderr before stdout: the agent must drain both pipes at once or the command blocks.
    command = (
        "head -c 1000000 /dev/zero | tr '\\0' e >&2; "
        "head -c 1000000 /dev/zero | tr '\\0' o; "
        "echo finished > finished.txt"
    )
    status, body = agent.run([_check("loud", command, timeout_s=20), _check("quiet", "printf 'short'")])
    assert status == 200
    loud, quiet = body["results"]
    assert loud["timed_out"] is False
    assert loud["exit_code"] == 0
    assert loud["stdout"] == "o" * cap
    assert loud["stderr"] == "e" * cap
    assert loud["stdout_truncated"] is True
    assert loud["stderr_truncated"] is True
    assert (agent.home / "finished.txt").read_text() == "finished\n"
    assert quiet["stdout"] == "short"
    assert quiet["stdout_truncated"] is False
    assert quiet["stderr_truncated"] is False


def test_output_of_exactly_the_cap_is_not_truncated(agent: RunningAgent) -> None:
    cap = agent_module.OUTPUT_CAP_BYTES
    status, body = agent.run([_check("exact", f"head -c {cap} /dev/zero | tr '\\0' x")])
    assert status == 200
    result = body["results"][0]
    assert len(result["stdout"]) == cap
    assert result["stdout_truncated"] is False


def test_output_is_decoded_as_utf8_with_invalid_bytes_replaced(agent: RunningAgent) -> None:
    status, body = agent.run([_check("utf8", "printf '\\346\\227\\245\\346\\234\\254 \\377'")])
    assert status == 200
    assert body["results"][0]["stdout"] == "日本 \ufffd"


def test_a_cut_through_a_multibyte_character_is_dropped_not_garbled() -> None:
    output = agent_module.CappedOutput(cap=4)
    output.feed("aé€".encode())  # 1 + 2 + 3 bytes: the cap falls inside the euro sign
    assert output.truncated is True
    assert output.text() == "aé"


# --- bad requests -----------------------------------------------------------------------------------------------

TOO_MANY_CHECKS = {"checks": [_check(f"c{i}", "true") for i in range(agent_module.MAX_CHECKS + 1)]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"checks": [', "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[]", "must be a JSON object"),
        (b"{}", "missing field: checks"),
        (b'{"checks": {}}', "checks must be a list"),
        (b'{"checks": []}', "must not be empty"),
        (json.dumps(TOO_MANY_CHECKS).encode(), "too many checks"),
        (b'{"checks": ["echo hi"]}', "checks[0] must be an object"),
        (b'{"checks": [{"command": "true", "timeout_s": 5}]}', "missing field: id"),
        (b'{"checks": [{"id": "a", "timeout_s": 5}]}', "missing field: command"),
        (b'{"checks": [{"id": "a", "command": "true"}]}', "missing field: timeout_s"),
        (b'{"checks": [{"id": 7, "command": "true", "timeout_s": 5}]}', "id must be"),
        (b'{"checks": [{"id": "", "command": "true", "timeout_s": 5}]}', "id must be"),
        (b'{"checks": [{"id": "a", "command": ["ls"], "timeout_s": 5}]}', "command must be"),
        (b'{"checks": [{"id": "a", "command": "  ", "timeout_s": 5}]}', "command must be"),
        (b'{"checks": [{"id": "a", "command": "true\\u0000", "timeout_s": 5}]}', "NUL"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": 0}]}', "timeout_s"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": -1}]}', "timeout_s"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": 601}]}', "timeout_s"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": "5"}]}', "timeout_s"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": true}]}', "timeout_s"),
        (b'{"checks": [{"id": "a", "command": "true", "timeout_s": NaN}]}', "timeout_s"),
        (
            json.dumps({"checks": [_check("a", "x" * (agent_module.MAX_COMMAND_CHARS + 1))]}).encode(),
            "command is too long",
        ),
        (json.dumps({"checks": [_check("a", "true"), _check("a", "false")]}).encode(), "duplicate"),
    ],
)
def test_malformed_run_requests_get_400_and_run_nothing(agent: RunningAgent, body: bytes, message: str) -> None:
    status, _, payload = agent.request("POST", "/v1/run", body=body)
    assert status == 400
    assert message in payload["error"]
    status, _, _ = agent.request("GET", "/healthz")
    assert status == 200


def test_deeply_nested_json_is_refused_without_a_crash(agent: RunningAgent) -> None:
    body = b'{"checks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert len(body) <= agent_module.MAX_BODY_BYTES
    status, _, payload = agent.request("POST", "/v1/run", body=body)
    assert status == 400
    assert "error" in payload
    assert agent.request("GET", "/healthz")[0] == 200


def _raw_exchange(port: int, request: bytes) -> tuple[int, dict[str, str], Any]:
    """Send raw bytes and read the whole response until the agent closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def test_oversize_body_gets_413_before_it_is_read(agent: RunningAgent) -> None:
    # Announce 10 MiB and send none of it: the agent must answer from Content-Length alone and close.
    request = (
        "POST /v1/run HTTP/1.1\r\nHost: agent\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {10 * 1024 * 1024}\r\n\r\n"
    ).encode()
    status, headers, payload = _raw_exchange(agent.port, request)
    assert status == 413
    assert headers["connection"] == "close"
    assert "too large" in payload["error"]
    assert agent.request("GET", "/healthz")[0] == 200


def test_body_without_content_length_is_refused(agent: RunningAgent) -> None:
    request = (
        f"POST /v1/run HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ).encode()
    status, _, payload = _raw_exchange(agent.port, request)
    assert status == 411
    assert "Content-Length" in payload["error"]

    request = f"POST /v1/run HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    status, _, payload = _raw_exchange(agent.port, request)
    assert status == 411


def test_garbage_request_line_gets_a_json_error(agent: RunningAgent) -> None:
    status, _, payload = _raw_exchange(agent.port, b"\x00\x01 / NOT-HTTP\r\n\r\n")
    assert status == 400
    assert "error" in payload
    assert agent.request("GET", "/healthz")[0] == 200


def test_unknown_path_gets_404_and_wrong_method_405(agent: RunningAgent) -> None:
    status, _, payload = agent.request("GET", "/v1/nothing")
    assert status == 404
    assert "/v1/nothing" in payload["error"]

    status, response, payload = agent.request("GET", "/v1/run")
    assert status == 405
    assert response.getheader("Allow") == "POST"

    status, response, _ = agent.request("POST", "/healthz", body=b"{}")
    assert status == 405
    assert response.getheader("Allow") == "GET"

    status, _, _ = agent.request("DELETE", "/v1/run")
    assert status == 405


def test_one_connection_carries_several_requests(agent: RunningAgent) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        for index in range(3):
            body = json.dumps({"checks": [_check("k", f"echo {index}")]}).encode()
            conn.request("POST", "/v1/run", body=body, headers=headers)
            response = conn.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["results"][0]["stdout"] == f"{index}\n"
        conn.request("POST", "/v1/run", body=b"{", headers=headers)
        response = conn.getresponse()
        assert response.status == 400
        response.read()
        conn.request("GET", "/healthz", headers=headers)
        assert conn.getresponse().status == 200
    finally:
        conn.close()


# --- concurrency ------------------------------------------------------------------------------------------------


def test_concurrent_runs_beyond_the_bound_get_429(start_agent: Callable[..., RunningAgent]) -> None:
    running = start_agent("--max-concurrent", "2")
    wait_for_release = "touch started-{n}; while [ ! -e release ]; do sleep 0.02; done; echo released-{n}"
    outcomes: dict[int, tuple[int, Any]] = {}

    def occupy(n: int) -> None:
        outcomes[n] = running.run([_check(f"hold{n}", wait_for_release.format(n=n), timeout_s=20)])

    threads = [threading.Thread(target=occupy, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while not all((running.home / f"started-{n}").exists() for n in (1, 2)):
            assert time.monotonic() < deadline, "the two runs did not start"
            time.sleep(0.02)

        status, response, payload = running.request(
            "POST", "/v1/run", body=json.dumps({"checks": [_check("third", "touch third-ran")]}).encode()
        )
        assert status == 429
        assert int(response.getheader("Retry-After")) >= 1
        assert "too many runs" in payload["error"]
        assert not (running.home / "third-ran").exists()
        # Health checks are not runs and still answer while the slots are taken.
        assert running.request("GET", "/healthz")[0] == 200
    finally:
        (running.home / "release").touch()
        for thread in threads:
            thread.join(timeout=20)

    for n in (1, 2):
        status, body = outcomes[n]
        assert status == 200
        assert body["results"][0]["stdout"] == f"released-{n}\n"
    # The slots are free again.
    status, body = running.run([_check("after", "echo free")])
    assert status == 200
    assert body["results"][0]["stdout"] == "free\n"


# --- start-up ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_agent_refuses_to_start_without_a_token(tmp_path: Path, content: str | None) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    result = subprocess.run(
        [
            AGENT_PYTHON,
            str(AGENT_PATH),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--token-file",
            str(token_file),
            "--port-file",
            str(tmp_path / "port"),
            "--home",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode != 0
    assert str(token_file) in result.stderr
    assert "token" in result.stderr
    assert not (tmp_path / "port").exists()


def test_sigterm_stops_the_agent_cleanly(start_agent: Callable[..., RunningAgent]) -> None:
    running = start_agent()
    running.proc.terminate()
    assert running.proc.wait(timeout=10) == 0


def test_the_agent_can_listen_on_a_unix_socket_instead_of_tcp(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("unix-socket-token-0123456789\n")
    path = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(AGENT_PATH),
            "--unix-socket",
            str(path),
            "--token-file",
            str(token_file),
            "--home",
            str(tmp_path),
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not path.is_socket():
            assert proc.poll() is None and time.monotonic() < deadline, "the agent did not listen"
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(str(path))
            connection.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
                b"Authorization: Bearer unix-socket-token-0123456789\r\n\r\n"
            )
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0]
        assert json.loads(body)["ready"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
