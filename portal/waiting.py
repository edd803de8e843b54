"""Waiting in asyncio without losing a cancellation (Python 3.11's ``wait_for`` can swallow one,
cpython#86296): ``wait_event`` waits for an event with a time limit, ``cancel_and_wait`` cancels a task again
until it has really ended, so a closing console's ``disconnect()`` never waits forever."""

from __future__ import annotations

import asyncio

# How long a cancelled task gets to end before it is cancelled again: long enough for the cleanup it does on its
# way out (closing a socket, say), which a second cancellation would cut short.
CANCEL_RETRY_SECONDS = 1.0


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(task: asyncio.Task) -> None:
    """Cancel ``task`` and return once it has ended, raising what it failed with; unlike
    ``suppress(CancelledError): await task``, it never swallows the caller's own cancellation."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=CANCEL_RETRY_SECONDS)
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error
