"""The console consumer's "Take control": while a member of staff holds the keyboard the student's console is
read-only (their input is refused here, not only hidden by the page), every viewer is told who holds it, and the
student gets it back when staff release it, leave, or their process dies (the holder key expires)."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from labs.console.access import console_control_record
from labs.console.control import control_holder, control_release, control_take
from labs.consumers.console_part import ConsolePart
from portal.waiting import cancel_and_wait

logger = logging.getLogger("labs.consumers.console")


class ConsoleControl(ConsolePart):
    """Mixed into ``AttemptConsoleConsumer``."""

    keyboard: str | None = None  # the member of staff holding the keyboard, if anybody
    control_mine = False  # this (staff) viewer holds it
    control_task: asyncio.Task | None = None  # staff: renews the holder key; student: watches it expire

    async def _control_at_connect(self) -> None:
        holder = await control_holder(attempt_id=self.attempt_id)
        if holder is not None:
            self.keyboard = str(holder.get("who", ""))
            if self.access.is_student:
                self.can_write = False
                self._control_task_start(self._watch_control())

    async def _set_control(self, *, taken: bool) -> None:
        if not self.access.is_staff or self.access.is_student:
            await self._notice("not_allowed")
            return
        if taken and not self.control_mine:
            await self._take_control()
        elif not taken and self.control_mine:
            await self._release_control()

    async def _take_control(self) -> None:
        who = self.access.viewer_name
        await database_sync_to_async(console_control_record)(actor=self.user, attempt_id=self.attempt_id, taken=True)
        await control_take(attempt_id=self.attempt_id, by=self.channel_name, who=who, ttl=self._control_ttl())
        self.control_mine, self.can_write, self.keyboard = True, True, who
        self._control_task_start(self._renew_control())
        await self._send_hello()
        await self.channel_layer.group_send(
            self.output_group, {"type": "console.control", "who": who, "by": self.channel_name}
        )
        await self._broadcast_notice("control_taken", who=who)
        if self.recorder is not None:
            self.recorder.marker(f"control taken by {who}")

    async def _release_control(self, *, leaving: bool = False) -> None:
        """Hand the keyboard back to the student (on Release, or as this viewer leaves)."""
        self.control_mine, self.can_write, self.keyboard = False, False, None
        if self.control_task is not None and self.control_task is not asyncio.current_task():
            await cancel_and_wait(self.control_task)
        self.control_task = None
        await control_release(attempt_id=self.attempt_id, by=self.channel_name)
        await database_sync_to_async(console_control_record)(actor=self.user, attempt_id=self.attempt_id, taken=False)
        await self.channel_layer.group_send(
            self.output_group, {"type": "console.control", "who": None, "by": self.channel_name}
        )
        await self._broadcast_notice("control_released", who=self.access.viewer_name)
        if self.recorder is not None:
            self.recorder.marker(f"control released by {self.access.viewer_name}")
        if not leaving:
            await self._send_hello()

    async def _end_control(self) -> None:
        if self.control_mine:
            await self._release_control(leaving=True)
        elif self.control_task is not None:
            await cancel_and_wait(self.control_task)

    async def console_control(self, event: dict) -> None:
        if event.get("by") == self.channel_name:
            return
        who = event.get("who")
        if self.control_mine and who:
            # A colleague took the keyboard over: this viewer watches again.
            self.control_mine, self.can_write = False, False
            if self.control_task is not None:
                await cancel_and_wait(self.control_task)
        self.keyboard = who
        if self.access.is_student:
            self.can_write = who is None
            if who:
                self._control_task_start(self._watch_control())
            elif self.control_task is not None:
                await cancel_and_wait(self.control_task)
        await self._send_hello()

    # -- keeping the holder key alive, and noticing when it is gone ---------------------------------------------

    def _control_ttl(self) -> float:
        return float(self.limits.lease_ttl_seconds)

    def _control_task_start(self, work) -> None:
        if self.control_task is not None and not self.control_task.done():
            self.control_task.cancel()
        self.control_task = asyncio.create_task(work, name=f"console-{self.attempt_id}-control")

    async def _renew_control(self) -> None:
        while self.control_mine:
            await asyncio.sleep(self._control_ttl() / 3)
            try:
                holder = await control_holder(attempt_id=self.attempt_id)
                if holder is not None and holder.get("by") != self.channel_name:
                    return  # a colleague took over (their console.control says so)
                await control_take(
                    attempt_id=self.attempt_id,
                    by=self.channel_name,
                    who=self.access.viewer_name,
                    ttl=self._control_ttl(),
                )
            except Exception:
                logger.exception("Console %s: renewing control failed; retrying", self.attempt_id)

    async def _watch_control(self) -> None:
        """The student's side: a holder whose process died never says so; its key expires, and the keyboard
        comes back."""
        while self.keyboard:
            await asyncio.sleep(self._control_ttl() / 3)
            try:
                holder = await control_holder(attempt_id=self.attempt_id)
            except Exception:
                logger.exception("Console %s: reading who has control failed; retrying", self.attempt_id)
                continue
            if holder is None:
                who, self.keyboard, self.can_write = self.keyboard, None, True
                await self._send_hello()
                await self._notice("control_released", who=who)
                return
