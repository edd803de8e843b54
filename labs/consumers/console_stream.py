"""The console consumer's bytes both ways: the browser's input with its limits, and output delivered within the
browser's flow window, redrawn from the scrollback when it lagged or a chunk went missing."""

from __future__ import annotations

import json

from django.conf import settings

from labs.consumers.console_part import ConsolePart


class ConsoleStream(ConsolePart):
    # -- browser → bridge ---------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None:
            await self._input(bytes_data)
            return
        try:
            message = json.loads(text_data or "")
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser follows
            await self._notice("bad_message")
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "ack":
            await self._acknowledge(message.get("bytes"))
        elif kind == "take_control":
            await self._set_control(taken=True)
        elif kind == "release_control":
            await self._set_control(taken=False)
        elif kind == "resize":
            await self._resize(message)
        elif kind == "ping":
            await self._send_json({"type": "pong"})
        else:
            await self._notice("bad_message")

    async def _input(self, data: bytes) -> None:
        assert self.access is not None  # input arrives only on an accepted socket
        if not self.can_write:
            if self.access.is_student and self.keyboard:
                await self._notice("keyboard_held", who=self.keyboard)  # staff hold the keyboard for now
            else:
                await self._notice("read_only")
            return
        if len(data) > settings.CONSOLE_INPUT_FRAME_MAX_BYTES:
            await self._notice("input_too_large")
            return
        if not self.input_limiter.allow(len(data)):
            await self._notice("input_rate")
            return
        if self.upstream is not None:
            if not await self.upstream.send(data):
                await self._notice("not_connected")
        else:
            await self.channel_layer.group_send(self.input_group, {"type": "console.input", "data": data})

    async def _acknowledge(self, total: object) -> None:
        if not isinstance(total, int) or isinstance(total, bool):
            await self._notice("bad_message")
            return
        if self.window.acknowledge(total):
            await self._redraw()

    # -- bridge → browser ---------------------------------------------------------------------------------

    async def _deliver(self, data: bytes, end: int) -> None:
        async with self.deliver_lock:
            await self._deliver_locked(data, end)

    async def _deliver_locked(self, data: bytes, end: int) -> None:
        """Send one chunk of output (ending at offset ``end``) unless already sent or the browser is behind. One
        starting past what this browser has means output went missing (a full channel, a holder that did not know
        of this viewer yet): the screen is redrawn from the scrollback, which holds everything published."""
        if end <= self.delivered_end:
            return
        if self.window.lagging_since is not None:
            self.window.may_send(len(data))  # counts what is skipped; the catch-up redraw replaces it
            self.delivered_end = end
            return
        start = end - len(data)
        if start > self.delivered_end:
            await self._redraw_locked()
            if end <= self.delivered_end:
                return
        if start < self.delivered_end:
            data = data[self.delivered_end - start :]
        self.delivered_end = end
        if not self.window.may_send(len(data)):
            await self._send_json({"type": "lagging"})
            return
        # Counted before sending: the browser's acknowledgement may be handled before send() returns.
        self.window.record_sent(len(data))
        await self.send(bytes_data=data)

    async def _redraw(self) -> None:
        """A lagging browser caught up: give it a fresh screen from scrollback instead of the skipped bytes."""
        async with self.deliver_lock:
            await self._redraw_locked()

    async def _redraw_locked(self) -> None:
        if self.fanout is not None:
            # The holder's own tab runs ahead of the scrollback: let the fan-out catch up, so the snapshot ends
            # exactly where this tab's next chunk starts.
            await self.fanout.flush()
        snapshot = await self.state.scrollback_snapshot(attempt_id=self.attempt_id)
        cols, rows = await self.state.size_get(attempt_id=self.attempt_id)
        await self._send_json({"type": "reset", "replay": len(snapshot.data), "cols": cols, "rows": rows})
        if snapshot.data:
            self.window.record_sent(len(snapshot.data))
            await self.send(bytes_data=snapshot.data)
        self.delivered_end = snapshot.end

    async def console_output(self, event: dict) -> None:
        if event.get("origin") != self.channel_name:
            await self._deliver(event["data"], event["end"])

    async def console_sync(self, event: dict) -> None:
        if event["end"] > self.delivered_end:
            await self._redraw()
