"""The console consumer's holder side: taking the lease, holding the single upstream connection to the VMI console
while renewing the lease, publishing its output, and handing everything back."""

from __future__ import annotations

import asyncio
import logging
import time

from channels.exceptions import ChannelFull
from django.conf import settings

from labs.console.fanout import OutputFanout
from labs.console.recording import AsciicastRecorder
from labs.console.upstream import ConsoleUpstream, UpstreamState
from labs.consumers.console_part import ConsolePart
from portal.waiting import cancel_and_wait, wait_event

logger = logging.getLogger("labs.consumers.console")

CLOSE_TOO_SLOW = 4008  # a viewer that stayed too far behind the output


class ConsoleHolder(ConsolePart):
    async def console_input(self, event: dict) -> None:
        if self.upstream is not None:
            await self.upstream.send(event["data"])

    async def console_viewer_joined(self, event: dict) -> None:
        fanout, upstream = self.fanout, self.upstream
        if event["reply_to"] == self.channel_name or fanout is None:
            return
        # Publish from now on; what the newcomer missed since its snapshot it redraws from the scrollback.
        fanout.viewer_joined()
        await fanout.flush()
        try:
            await self.channel_layer.send(event["reply_to"], {"type": "console.sync", "end": fanout.published_end})
            if upstream is not None and upstream.state is not None:
                await self.channel_layer.send(
                    event["reply_to"], {"type": "console.status", "state": upstream.state.value, "origin": "holder"}
                )
        except ChannelFull:
            # The newcomer is gone already, or too far behind to read: it resynchronises when it reads again.
            logger.info("Console %s: a newcomer's channel is full; not answered", self.attempt_id)

    async def _ownership_loop(self) -> None:
        """Keep this viewer registered; take the lease when it is free and hold the upstream while renewing the
        lease; close a viewer stuck behind."""
        ttl = settings.CONSOLE_LEASE_TTL_SECONDS
        next_beat = time.monotonic() + ttl / 3
        while True:
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + ttl / 3
                    await self._beat()
                    await self._beat_control()
                until_beat = max(next_beat - time.monotonic(), 0.0)
                if self.upstream_task is None:
                    # Cleared before asking: a holder that leaves while the lease is being asked for is not missed.
                    self.owner_gone.clear()
                    self.lease_claimed = True
                    if await self.state.lease_acquire(attempt_id=self.attempt_id, holder=self.channel_name, ttl=ttl):
                        try:
                            await self._start_owning()
                        except Exception:
                            # Redis or the disk failed half-way: hand back what was taken, then try again.
                            await self._stop_owning(release=True)
                            raise
                        continue
                    self.lease_claimed = False
                    # A holder leaving says so (owner_gone); the timeout covers one that died silently.
                    if not await wait_event(self.owner_gone, until_beat) and not self.status_seen:
                        # The holder lives on but never answered (a full channel, a handover): ask it again.
                        await self._announce()
                elif self.upstream_task.done():
                    await self._stop_owning(release=True)
                    await asyncio.sleep(1.0)
                else:
                    self.ownership_changed.clear()
                    await wait_event(self.ownership_changed, until_beat)
                if self.window.lagging_for() > settings.CONSOLE_LAG_CLOSE_SECONDS:
                    await self._send_json({"type": "notice", "code": "too_slow"})
                    await self.close(code=CLOSE_TOO_SLOW)
                    return
            except Exception:
                # Redis briefly unreachable, say: keep trying rather than leaving the viewer without a holder.
                logger.exception("Console %s: lease handling failed; retrying", self.attempt_id)
                await asyncio.sleep(1.0)

    async def _beat(self) -> None:
        """Renew this viewer's registration and, while it holds the upstream, the lease; the fan-out learns
        whether anybody else watches, as of the look's start."""
        as_of = time.monotonic()
        others = await self.state.viewer_add(attempt_id=self.attempt_id, viewer=self.channel_name)
        if self.fanout is None:
            return
        renewed = await self.state.lease_acquire(
            attempt_id=self.attempt_id, holder=self.channel_name, ttl=settings.CONSOLE_LEASE_TTL_SECONDS
        )
        if not renewed:
            # The lease expired while this process was too busy to renew it, and somebody took it.
            logger.warning("Console %s: lease lost; handing the upstream over", self.attempt_id)
            await self._stop_owning(release=False)
            return
        if renewed == 2:
            logger.warning("Console %s: lease had expired; taken again", self.attempt_id)
        self.fanout.observe_others(others, as_of)

    async def _start_owning(self) -> None:
        snapshot = await self.state.scrollback_snapshot(attempt_id=self.attempt_id)
        # From then on the beat says whether anybody else watches, and newcomers announce themselves.
        others = await self.state.viewers_others(attempt_id=self.attempt_id, viewer=self.channel_name)
        self.fanout = OutputFanout(
            attempt_id=self.attempt_id,
            state=self.state,
            channel_layer=self.channel_layer,
            group=self.output_group,
            origin=self.channel_name,
            start_end=snapshot.end,
            others=others,
        )
        self.recorder = AsciicastRecorder(
            attempt_id=self.attempt_id,
            max_bytes=settings.CONSOLE_RECORDING_MAX_BYTES,
            flush_seconds=settings.CONSOLE_RECORDING_FLUSH_SECONDS,
        )
        await self.recorder.open()
        self.upstream = ConsoleUpstream(
            locate=self._locate,
            on_output=self._upstream_output,
            on_state=self._upstream_state,
            attempt_changed=self.attempt_changed,
        )
        self.in_input_group = True
        await self.channel_layer.group_add(self.input_group, self.channel_name)
        self.upstream_task = asyncio.create_task(self._run_upstream(), name=f"console-{self.attempt_id}-upstream")
        self.upstream_task.add_done_callback(lambda _: self.ownership_changed.set())

    async def _run_upstream(self) -> None:
        assert self.upstream is not None  # set before this task starts
        try:
            await self.upstream.run()
        except Exception:
            # The ownership loop sees the finished task and hands the lease over, so a holder starts afresh.
            logger.exception("Console %s: upstream bridge failed", self.attempt_id)
            await self._upstream_state(UpstreamState.LOST, "bridge error")

    async def _stop_owning(self, *, release: bool) -> None:
        """Hand back what this viewer holds; each resource is let go of before it is forgotten, so a second call
        finishes a cancelled one. Without ``release`` somebody else holds the lease already."""
        self.upstream = None
        if self.upstream_task is not None:
            await cancel_and_wait(self.upstream_task)
            self.upstream_task = None
        if self.fanout is not None:
            await self.fanout.close()
            self.fanout = None
        if self.recorder is not None:
            await self.recorder.close()
            self.recorder = None
        if self.in_input_group:
            await self.channel_layer.group_discard(self.input_group, self.channel_name)
            self.in_input_group = False
        if self.lease_claimed:
            if release:
                await self.state.lease_release(attempt_id=self.attempt_id, holder=self.channel_name)
                await self.channel_layer.group_send(self.output_group, {"type": "console.owner_gone"})
            self.lease_claimed = False

    async def _upstream_output(self, data: bytes) -> None:
        # This viewer's own browser first (an echo must not wait for Redis), then the fan-out; under the delivery
        # lock, so that a redraw never finds a chunk shown here but not yet queued.
        assert self.fanout is not None  # output arrives only while this viewer holds the upstream
        async with self.deliver_lock:
            end = self.fanout.claim(len(data))
            await self._deliver_locked(data, end)
            if self.recorder is not None:
                self.recorder.output(data)
            await self.fanout.put(data)

    async def _upstream_state(self, state: UpstreamState, detail: str) -> None:
        await self._send_status(state.value, detail)
        if self.recorder is not None and state in (UpstreamState.CONNECTED, UpstreamState.LOST):
            self.recorder.marker(f"console {state.value}")
        # Alone, nobody else is told: a viewer who arrives gets the state in answer to its announcement.
        if self.fanout is None or self.fanout.others:
            await self.channel_layer.group_send(
                self.output_group,
                {"type": "console.status", "state": state.value, "detail": detail, "origin": self.channel_name},
            )
