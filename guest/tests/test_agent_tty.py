"""The agent's /v1/tty-size: the serial console's size set without typing into it, and kept over a logout."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from guest.tests import test_agent as agent_tests
from guest.tests.test_agent import RunningAgent

start_agent = agent_tests.start_agent  # the fixture

pytestmark = pytest.mark.timeout(60)


def _size(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, cols


@pytest.fixture
def console() -> Iterator[tuple[int, str]]:
    """A pty standing in for the guest's /dev/ttyS0: its master, and the slave's path the agent opens."""
    master, slave = pty.openpty()
    path = os.ttyname(slave)
    os.close(slave)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    yield master, path
    os.close(master)


def _resize(agent: RunningAgent, body: object, **kwargs) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, payload = agent.request("POST", "/v1/tty-size", body=raw, **kwargs)
    return status, payload


def test_the_console_takes_the_size_asked_for(start_agent: Callable[..., RunningAgent], console) -> None:
    master, path = console
    agent = start_agent("--console-tty", path)
    assert _resize(agent, {"rows": 41, "cols": 157}) == (200, {"rows": 41, "cols": 157})
    assert _size(master) == (41, 157)


def test_the_console_stays_open_once_sized_so_that_a_logout_does_not_lose_the_size(start_agent, console) -> None:
    # A serial line forgets its size when its last opener closes it, as a logout does: the agent stays one.
    _, path = console
    agent = start_agent("--console-tty", path)

    def opened() -> int:
        fds = Path(f"/proc/{agent.proc.pid}/fd")
        return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == os.path.realpath(path))

    assert opened() == 0
    assert _resize(agent, {"rows": 41, "cols": 157})[0] == 200
    assert opened() == 1
    assert _resize(agent, {"rows": 30, "cols": 100})[0] == 200
    assert opened() == 1  # the one held, not one more per resize


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        {"rows": 40},
        {"rows": "40", "cols": 100},
        {"rows": 40, "cols": True},
        {"rows": 1, "cols": 100},
        {"rows": 40, "cols": 100000},
        {"rows": 40.5, "cols": 100},
    ],
    ids=["not-json", "not-object", "no-cols", "string", "bool", "too-few-rows", "too-many-cols", "float"],
)
def test_a_bad_size_gets_400_and_changes_nothing(start_agent, console, body) -> None:
    master, path = console
    agent = start_agent("--console-tty", path)
    status, payload = _resize(agent, body)
    assert status == 400 and payload["error"]
    assert _size(master) == (24, 80)


def test_a_resize_without_the_token_gets_401_and_changes_nothing(start_agent, console) -> None:
    master, path = console
    agent = start_agent("--console-tty", path)
    status, _ = _resize(agent, {"rows": 30, "cols": 90}, token="wrong")
    assert status == 401
    assert _size(master) == (24, 80)


def test_a_console_that_cannot_be_opened_gets_503(start_agent, tmp_path: Path) -> None:
    agent = start_agent("--console-tty", str(tmp_path / "no-such-tty"))
    status, payload = _resize(agent, {"rows": 30, "cols": 90})
    assert status == 503 and "no-such-tty" in payload["error"]
