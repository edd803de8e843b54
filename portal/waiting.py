"""Waiting in asyncio code without losing a cancellation: for an event with a time limit, and for a task to end.

Python 3.11's ``asyncio.wait_for`` runs what it waits for as a task of its own. When the task waiting in
``wait_for`` is cancelled in the same turn of the loop in which that inner task finishes, ``wait_for`` returns the
result and the cancellation is gone (python/cpython#86296, fixed in 3.12 by building ``wait_for`` on
``asyncio.timeout``). redis-py's asyncio client writes every command under ``wait_for`` (its socket timeout), so a
task cancelled while a Redis command is on its way could simply go on (the portal's asyncio Redis pools now write
under ``asyncio.timeout``: ``portal.redis_async``). A console's lease loop, upstream and fan-out
all talk to Redis and are cancelled when their tab closes: when a cancellation was lost, ``disconnect()`` waited
for the task forever and daphne killed the consumer ten seconds later, without its cleanup (its upstream, lease and
viewer registration left behind).

``wait_event`` waits in the calling task (``asyncio.timeout`` tells its own expiry apart from any other
cancellation); ``cancel_and_wait`` cancels again until the task has really ended.
"""

from __future__ import annotations

import asyncio

# How long a cancelled task gets to end before it is cancelled again: long enough for the cleanup it does on its
# way out (closing a socket, say), which a second cancellation would cut short.
CANCEL_RETRY_SECONDS = 1.0


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` have passed; True when it was set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(task: asyncio.Task) -> None:
    """Cancel ``task`` and return once it has ended, raising what it failed with (not its cancellation).

    The caller's own cancellation is never swallowed here, unlike ``suppress(CancelledError): await task``,
    which also hides a cancellation of the caller that lands while it waits."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=CANCEL_RETRY_SECONDS)
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error
