"""The guest console's size: set through the lab agent (no typing into the student's shell), and remembered per
attempt so that a tab replaying the scrollback draws it at the width it was written at."""

from __future__ import annotations

import logging

from labs.access import attempt_get_for_user
from labs.console.redis_client import console_key, shared_redis
from labs.console.stage import console_stage
from portal.models import User

logger = logging.getLogger(__name__)

# What a guest's console starts at (kubesim's pty; a serial port that nobody sized reads as 80x24 to programs).
DEFAULT_SIZE = (80, 24)
ROWS_RANGE = (2, 500)  # as the agent accepts
COLS_RANGE = (2, 1000)
SIZE_EXPIRY_SECONDS = 24 * 3600  # as the scrollback's

_local_sizes: dict[int, tuple[int, int]] = {}  # without Redis: this process's consoles


def size_valid(rows: object, cols: object) -> bool:
    return all(
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        for value, (low, high) in ((rows, ROWS_RANGE), (cols, COLS_RANGE))
    )


async def console_size_get(*, attempt_id: int) -> tuple[int, int]:
    """The guest console's (cols, rows) as last set through the portal, else the guest's default."""
    client = shared_redis()
    if client is None:
        return _local_sizes.get(attempt_id, DEFAULT_SIZE)
    raw = await client.get(console_key("size", attempt_id))
    if not isinstance(raw, bytes):  # none set yet
        return DEFAULT_SIZE
    try:
        cols, rows = (int(part) for part in raw.split(b"x"))
    except ValueError:
        return DEFAULT_SIZE
    return cols, rows


async def console_size_set(*, attempt_id: int, cols: int, rows: int) -> None:
    client = shared_redis()
    if client is None:
        _local_sizes[attempt_id] = (cols, rows)
        return
    await client.set(console_key("size", attempt_id), f"{cols}x{rows}", ex=SIZE_EXPIRY_SECONDS)


def console_resize(*, user: User, attempt_id: int, rows: int, cols: int) -> bool:
    """Ask the attempt's agent to set its serial console's size. False when it cannot (no agent answering, a
    guest without one): the caller may then type ``stty`` instead."""
    from labs.agent_client import AgentError, set_tty_size

    attempt = attempt_get_for_user(user=user, attempt_id=attempt_id, related=False)
    if console_stage(state=attempt.state, phase=attempt.phase) != "ready":
        return False
    try:
        set_tty_size(attempt, rows=rows, cols=cols)
    except AgentError as error:
        logger.info("attempt %s: console size not set through the agent (%s: %s)", attempt_id, error.code, error)
        return False
    return True
