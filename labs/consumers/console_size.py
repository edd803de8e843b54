"""The console consumer's terminal size: the browser's fitted size set on the guest through its agent (debounced),
typed as ``stty`` only when the student asked (Fit) and the agent cannot, and remembered for replays."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from labs.console.access import console_resize
from labs.consumers.console_part import ConsolePart
from portal.waiting import cancel_and_wait

logger = logging.getLogger("labs.consumers.console")

_console_resize = database_sync_to_async(console_resize, thread_sensitive=False)

# A window being dragged sends a size every few milliseconds: only the last one, this long after, is set.
RESIZE_DEBOUNCE_SECONDS = 0.2
ROWS_RANGE = (2, 500)  # as the agent accepts
COLS_RANGE = (2, 1000)


def size_valid(rows: object, cols: object) -> bool:
    return all(
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        for value, (low, high) in ((rows, ROWS_RANGE), (cols, COLS_RANGE))
    )


class ConsoleSizing(ConsolePart):
    size_task: asyncio.Task | None = None
    size_wanted: tuple[int, int, bool] | None = None

    async def _resize(self, message: dict) -> None:
        rows, cols = message.get("rows"), message.get("cols")
        if not (isinstance(rows, int) and isinstance(cols, int) and size_valid(rows, cols)):
            await self._notice("bad_message")
            return
        if not self.can_write:
            # The size is the keyboard holder's: a watcher's window must not reflow the student's shell.
            return
        # An explicit Fit stays explicit even if a window resize follows it within the debounce.
        explicit = bool(message.get("explicit")) or bool(self.size_wanted and self.size_wanted[2])
        self.size_wanted = (rows, cols, explicit)
        if self.size_task is None or self.size_task.done():
            self.size_task = asyncio.create_task(self._apply_sizes(), name=f"console-{self.attempt_id}-size")

    async def _apply_sizes(self) -> None:
        await asyncio.sleep(RESIZE_DEBOUNCE_SECONDS)
        while self.size_wanted is not None:
            (rows, cols, explicit), self.size_wanted = self.size_wanted, None
            try:
                await self._apply_size(rows=rows, cols=cols, explicit=explicit)
            except Exception:
                logger.exception("Console %s: setting the size failed", self.attempt_id)

    async def _apply_size(self, *, rows: int, cols: int, explicit: bool) -> None:
        if await _console_resize(user=self.user, attempt_id=self.attempt_id, rows=rows, cols=cols):
            via, command = "agent", ""
        elif explicit and self.can_write:
            # The agent is not answering: type it, as the student asked. A leading space keeps the line out of
            # the shell's history (HISTCONTROL=ignorespace, the usual default).
            via, command = "typed", f" stty rows {rows} cols {cols}"
            await self._input((command + "\r").encode())
        else:
            await self._send_json({"type": "resized", "via": "none", "rows": rows, "cols": cols})
            return
        await self.state.size_set(attempt_id=self.attempt_id, cols=cols, rows=rows)
        if self.recorder is not None:
            self.recorder.resize(cols=cols, rows=rows)
        else:
            await self.channel_layer.group_send(
                self.output_group, {"type": "console.resized", "cols": cols, "rows": rows}
            )
        await self._send_json({"type": "resized", "via": via, "rows": rows, "cols": cols, "command": command})

    async def console_resized(self, event: dict) -> None:
        if self.recorder is not None:  # the holder records it
            self.recorder.resize(cols=event["cols"], rows=event["rows"])

    async def _end_sizing(self) -> None:
        if self.size_task is not None:
            await cancel_and_wait(self.size_task)
