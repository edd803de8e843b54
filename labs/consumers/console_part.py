"""What the console consumer's parts (``console_holder``, ``console_keyboard``) share: the state
``AttemptConsoleConsumer.connect`` sets up, and the messages every part sends to its browser."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labs.console.access import ConsoleAccess
    from labs.console.fanout import OutputFanout
    from labs.console.flow import OutputWindow
    from labs.console.recording import AsciicastRecorder
    from labs.console.state import LocalConsoleState, RedisConsoleState
    from labs.console.upstream import ConsoleLocation, ConsoleUpstream

# The same notice is sent at most this often to one browser (a TA leaning on the keyboard, a runaway paste).
NOTICE_INTERVAL_SECONDS = 1.0


class ConsolePart:
    # The holder's (console_holder), while this viewer holds the upstream.
    upstream: ConsoleUpstream | None = None
    upstream_task: asyncio.Task | None = None
    fanout: OutputFanout | None = None
    recorder: AsciicastRecorder | None = None
    # What this viewer may have taken as holder and must hand back: set before the step that takes it, since a
    # cancellation can land after Redis did the work but before its answer arrived.
    lease_claimed = False
    in_input_group = False
    status_seen = False

    if TYPE_CHECKING:
        channel_layer: Any
        channel_name: str
        attempt_id: int
        user: Any
        access: ConsoleAccess
        state: LocalConsoleState | RedisConsoleState
        can_write: bool
        output_group: str
        input_group: str
        notices_sent: dict[str, float]
        window: OutputWindow
        delivered_end: int
        deliver_lock: asyncio.Lock
        attempt_changed: asyncio.Event
        ownership_changed: asyncio.Event
        owner_gone: asyncio.Event

        async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None: ...
        async def close(self, code: int | None = None, reason: str | None = None) -> None: ...
        async def _send_hello(self, *, replay: int = 0, size: tuple[int, int] | None = None) -> None: ...
        async def _announce(self) -> None: ...
        async def _locate(self) -> ConsoleLocation: ...
        async def _input(self, data: bytes) -> None: ...
        async def _deliver_locked(self, data: bytes, end: int) -> None: ...
        async def _beat_control(self) -> None: ...

    async def _send_json(self, payload: dict) -> None:
        await self.send(text_data=json.dumps(payload))

    async def _send_status(self, state: str, detail: str = "") -> None:
        self.status_seen = True
        await self._send_json({"type": "status", "state": state, "detail": detail})

    async def _notice(self, code: str, **extra) -> None:
        now = time.monotonic()
        if now - self.notices_sent.get(code, 0.0) < NOTICE_INTERVAL_SECONDS:
            return
        self.notices_sent[code] = now
        await self._send_json({"type": "notice", "code": code, **extra})

    async def _broadcast_notice(self, code: str, **extra) -> None:
        """Tell every other viewer (the student above all) what this one did; its own page knows already."""
        await self.channel_layer.group_send(
            self.output_group, {"type": "console.notice", "code": code, "origin": self.channel_name, **extra}
        )
