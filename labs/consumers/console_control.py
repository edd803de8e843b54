"""The console consumer's "Take control": while a member of staff holds the keyboard the student's console is
read-only (their input is refused here, not only hidden by the page), every viewer is told who holds it, and the
student gets it back when staff release it, leave, or their process dies (the holder key expires)."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.conf import settings

from labs.console.access import console_control_record
from labs.consumers.console_part import ConsolePart


class ConsoleControl(ConsolePart):
    keyboard: str | None = None  # the member of staff holding the keyboard, if anybody
    control_mine = False  # this (staff) viewer holds it

    async def _control_at_connect(self) -> None:
        holder = await self.state.control_holder(attempt_id=self.attempt_id)
        if holder is not None:
            self.keyboard = str(holder.get("who", ""))
            if self.access.is_student:
                self.can_write = False

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
        await self.state.control_take(
            attempt_id=self.attempt_id, by=self.channel_name, who=who, ttl=settings.CONSOLE_LEASE_TTL_SECONDS
        )
        self.control_mine, self.can_write, self.keyboard = True, True, who
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
        await self.state.control_release(attempt_id=self.attempt_id, by=self.channel_name)
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
