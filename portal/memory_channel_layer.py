"""Channels' in-memory channel layer (the embedded default's), dropping a consumer's queue and groups as soon as it
ends (``discard_channel``, from ``portal.websocket_consumer``): an idle process would otherwise keep them, and
messages for a gone consumer are dropped as they expire unread with channels_redis."""

from __future__ import annotations

from channels import layers


class InMemoryChannelLayer(layers.InMemoryChannelLayer):
    extensions = [*layers.InMemoryChannelLayer.extensions, "discard_channel"]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # The process-specific channels whose consumers still run (every receiver here was made by new_channel).
        self.open_channels: set[str] = set()

    async def new_channel(self, prefix: str = "specific.") -> str:
        channel = await super().new_channel(prefix)
        self.open_channels.add(channel)
        return channel

    async def send(self, channel: str, message: dict) -> None:
        if "!" in channel and channel not in self.open_channels:
            return  # its consumer has ended: nobody will ever read it
        await super().send(channel, message)

    async def discard_channel(self, channel: str) -> None:
        """The consumer reading ``channel`` has ended: drop its queue and its group memberships."""
        self.open_channels.discard(channel)
        self.channels.pop(channel, None)
        for group in list(self.groups):
            await self.group_discard(group, channel)
