"""The console consumer's keyboard: the guest's terminal size (set through its agent, typed as ``stty`` only when the
student asked and the agent cannot) and staff's "Take control", which makes the student's console read-only."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

from labs.console.access import console_control_record, console_resize
from labs.consumers.console_part import ConsolePart
from portal.waiting import cancel_and_wait

logger = logging.getLogger("labs.consumers.console")

_console_resize = database_sync_to_async(console_resize, thread_sensitive=False)
_console_control_record = database_sync_to_async(console_control_record)

# A window being dragged sends a size every few milliseconds: only the last one, this long after, is set.
RESIZE_DEBOUNCE_SECONDS = 0.2


class ConsoleKeyboard(ConsolePart):
    size_task: asyncio.Task | None = None
    size_wanted: tuple[int, int, bool] | None = None
    keyboard: str | None = None  # the member of staff holding the keyboard, if anybody
    control_mine = False  # this (staff) viewer holds it

    # -- size -----------------------------------------------------------------------------------------------

    async def _resize(self, message: dict) -> None:
        rows, cols = message.get("rows"), message.get("cols")
        if not (type(rows) is int and type(cols) is int and 2 <= rows <= 500 and 2 <= cols <= 1000):  # agent's range
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

    # -- Take control -------------------------------------------------------------------------------------

    async def _control_at_connect(self) -> None:
        holder = await self.state.control_holder(attempt_id=self.attempt_id)
        if holder is not None:
            self.keyboard = str(holder.get("who", ""))
            if self.access.is_student:
                self.can_write = False

    async def _set_control(self, *, taken: bool, leaving: bool = False) -> None:
        """Take the keyboard from the student, or hand it back (on Release, or as this viewer leaves)."""
        if self.access.is_student:
            await self._notice("not_allowed")
            return
        if taken == self.control_mine:
            return
        who = self.access.viewer_name
        if taken:
            await _console_control_record(actor=self.user, attempt_id=self.attempt_id, taken=True)
            await self.state.control_take(
                attempt_id=self.attempt_id, by=self.channel_name, who=who, ttl=settings.CONSOLE_LEASE_TTL_SECONDS
            )
        else:
            await self.state.control_release(attempt_id=self.attempt_id, by=self.channel_name)
            await _console_control_record(actor=self.user, attempt_id=self.attempt_id, taken=False)
        self.control_mine, self.can_write, self.keyboard = taken, taken, who if taken else None
        await self.channel_layer.group_send(
            self.output_group, {"type": "console.control", "who": self.keyboard, "by": self.channel_name}
        )
        await self._broadcast_notice("control_taken" if taken else "control_released", who=who)
        if self.recorder is not None:
            self.recorder.marker(f"control {'taken' if taken else 'released'} by {who}")
        if not leaving:
            await self._send_hello()

    async def _end_sizing(self) -> None:
        if self.size_task is not None:
            await cancel_and_wait(self.size_task)

    async def _end_control(self) -> None:
        if self.control_mine:
            await self._set_control(taken=False, leaving=True)

    async def console_control(self, event: dict) -> None:
        if event.get("by") == self.channel_name:
            return
        who = event.get("who")
        if self.control_mine and who:
            # A colleague took the keyboard over: this viewer watches again.
            self.control_mine, self.can_write = False, False
        self.keyboard = who
        if self.access.is_student:
            self.can_write = who is None
        await self._send_hello()

    async def _beat_control(self) -> None:
        """Staff holding the keyboard renew the holder key. A holder whose process died never says so: its key
        expires, and the student gets the keyboard back."""
        if self.control_mine:
            holder = await self.state.control_holder(attempt_id=self.attempt_id)
            if holder is None or holder.get("by") == self.channel_name:  # else a colleague's console.control is due
                await self.state.control_take(
                    attempt_id=self.attempt_id,
                    by=self.channel_name,
                    who=self.access.viewer_name,
                    ttl=settings.CONSOLE_LEASE_TTL_SECONDS,
                )
        elif self.keyboard and self.access.is_student:
            if await self.state.control_holder(attempt_id=self.attempt_id) is None:
                who, self.keyboard, self.can_write = self.keyboard, None, True
                await self._send_hello()
                await self._notice("control_released", who=who)
