"""What the console consumer's parts (``console_size``, ``console_control``) may use of the consumer they are mixed
into, declared for the type checker: ``AttemptConsoleConsumer`` sets these up in ``connect``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labs.console.access import ConsoleAccess
    from labs.console.limits import ConsoleLimits
    from labs.console.recording import AsciicastRecorder


class ConsolePart:
    if TYPE_CHECKING:
        attempt_id: int
        user: Any
        access: ConsoleAccess
        can_write: bool
        limits: ConsoleLimits
        recorder: AsciicastRecorder | None
        channel_layer: Any
        channel_name: str
        output_group: str

        async def _send_json(self, payload: dict) -> None: ...
        async def _send_hello(self) -> None: ...
        async def _notice(self, code: str, **extra: Any) -> None: ...
        async def _broadcast_notice(self, code: str, **extra: Any) -> None: ...
        async def _input(self, data: bytes) -> None: ...
