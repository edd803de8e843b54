"""The agent's token rotation (``POST /v1/token``): a warm pool's VM takes the attempt's token at its claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guest.tests.test_agent import TOKEN, _start, _stop

pytestmark = pytest.mark.timeout(60)

NEW_TOKEN = "attempt-token-0123456789abcdef"


def test_rotation_refuses_the_old_token_and_persists_the_new_one(tmp_path: Path) -> None:
    agent = _start(tmp_path / "a")
    try:
        status, _, payload = agent.request("POST", "/v1/token", body=json.dumps({"token": NEW_TOKEN}).encode())
        assert (status, payload) == (200, {"rotated": True})
        assert agent.request("GET", "/healthz")[0] == 401
        assert agent.request("GET", "/healthz", token=NEW_TOKEN)[0] == 200
        # Only the current token may rotate it again.
        assert agent.request("POST", "/v1/token", body=json.dumps({"token": "x" * 20}).encode())[0] == 401
        assert (tmp_path / "a" / "token").read_text().strip() == NEW_TOKEN
    finally:
        _stop(agent)
    # A restarted agent reads the rotated token from its file.
    (tmp_path / "a" / "port").unlink()
    restarted = _start_without_rewriting(tmp_path / "a")
    try:
        assert restarted.request("GET", "/healthz", token=NEW_TOKEN)[0] == 200
        assert restarted.request("GET", "/healthz")[0] == 401
    finally:
        _stop(restarted)


def _start_without_rewriting(directory: Path):
    import subprocess
    import time

    from guest.tests.test_agent import AGENT_PATH, AGENT_PYTHON, RunningAgent

    log_path = directory / "agent2.log"
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
                str(directory / "token"),
                "--port-file",
                str(directory / "port"),
                "--home",
                str(directory / "home"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 10
    while not (directory / "port").exists():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.02)
    return RunningAgent(
        port=int((directory / "port").read_text()), home=directory / "home", log_path=log_path, proc=proc
    )


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"token": "short"}).encode(),
        json.dumps({"token": "bad token with spaces!"}).encode(),
    ],
)
def test_a_bad_rotation_is_refused_and_keeps_the_token(tmp_path: Path, body: bytes) -> None:
    agent = _start(tmp_path / "b")
    try:
        assert agent.request("POST", "/v1/token", body=body)[0] == 400
        assert agent.request("GET", "/healthz", token=TOKEN)[0] == 200
        assert (tmp_path / "b" / "token").read_text().strip() == TOKEN
    finally:
        _stop(agent)
