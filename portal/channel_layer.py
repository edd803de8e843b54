"""The portal's Redis channel layer: channels_redis's, with a receive that ends when it is cancelled.

A consumer that ends (its socket closed) cancels its pending ``receive()`` and waits for it (channels'
``await_many_dispatch``). channels_redis receives through redis-py, whose asyncio client loses a cancellation that
lands while a command is being written (``portal.waiting``): the receive then went on, the consumer never ended,
and daphne killed it ten seconds later, leaving that receive running for good: one more coroutine taking turns
at the process's Redis reads for a channel nobody listens to, for as long as the process lives.

Here a cancelled receive returns at once, and the receive underneath is cancelled again, in the background, until
it has ended. A message it takes meanwhile was for the consumer that is leaving.
"""

from __future__ import annotations

import asyncio
import logging

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer

from portal.waiting import cancel_and_wait

logger = logging.getLogger(__name__)


class RedisChannelLayer(BaseRedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._abandoned: set[asyncio.Task] = set()

    async def receive(self, channel: str) -> dict:
        pending = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            ending = asyncio.ensure_future(self._end(pending))
            self._abandoned.add(ending)
            ending.add_done_callback(self._abandoned.discard)
            raise

    @staticmethod
    async def _end(receive: asyncio.Future) -> None:
        try:
            await cancel_and_wait(receive)
        except Exception:
            logger.debug("an abandoned channel-layer receive ended with an error", exc_info=True)
