"""``portal.waiting``: waiting for an event with a time limit and cancelling a task, without losing a cancellation
(asyncio.wait_for on Python 3.11, and redis-py built on it, can lose one)."""

from __future__ import annotations

import asyncio

import pytest

from portal.waiting import cancel_and_wait, wait_event


async def woken_loop(event: asyncio.Event, wait) -> None:
    """A loop like the console's lease loop: wait for a wake-up (or the time limit), handle it, wait again."""
    while True:
        event.clear()
        await wait(event)


async def cancelled_as_woken(wait) -> asyncio.Task:
    event = asyncio.Event()
    task = asyncio.create_task(woken_loop(event, wait))
    await asyncio.sleep(0.05)  # the loop is waiting
    event.set()  # a wake-up and a cancellation in the same turn of the event loop
    task.cancel()
    await asyncio.wait([task], timeout=2)
    return task


async def test_a_cancellation_arriving_with_a_wake_up_ends_the_waiting_task():
    task = await cancelled_as_woken(lambda event: wait_event(event, 30))
    assert task.done() and task.cancelled()


async def test_the_race_is_real_with_asyncio_wait_for():
    """The same race through wait_for leaves the task running: what daphne logged as a console that 'took too
    long to shut down and was killed'. If a Python release fixes wait_for, this test says so."""

    async def with_wait_for(event: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(event.wait(), 30)
        except TimeoutError:
            pass

    task = await cancelled_as_woken(with_wait_for)
    try:
        assert not task.done(), "asyncio.wait_for kept the cancellation: portal.waiting may no longer be needed"
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=2)


async def test_reports_whether_the_event_was_set_or_the_time_ran_out():
    event = asyncio.Event()
    started = asyncio.get_running_loop().time()
    assert await wait_event(event, 0.05) is False
    assert asyncio.get_running_loop().time() - started >= 0.05
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True


@pytest.mark.parametrize("seconds", [0, -1])
async def test_no_time_left_means_an_unset_event_is_not_waited_for(seconds):
    assert await wait_event(asyncio.Event(), seconds) is False
    event = asyncio.Event()
    event.set()
    # asyncio.timeout(0) expires at the first suspension; an event already set never suspends.
    assert await wait_event(event, seconds) is True


async def test_cancel_and_wait_cancels_again_a_task_that_lost_its_cancellation():
    """What redis-py under Python 3.11 can do to a task: the first cancellation is swallowed and it goes on."""
    lost = []

    async def swallows_the_first_cancellation() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)

    task = asyncio.create_task(swallows_the_first_cancellation())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 2)
    assert lost == [True] and task.cancelled()


async def test_cancel_and_wait_raises_what_the_task_failed_with():
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)
    finished = asyncio.create_task(asyncio.sleep(0))
    await finished
    await cancel_and_wait(finished)  # already done: nothing to cancel, nothing raised


async def test_the_caller_of_cancel_and_wait_can_still_be_cancelled():
    stop = asyncio.Event()

    async def never_ends() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    stubborn = asyncio.create_task(never_ends())
    caller = asyncio.create_task(cancel_and_wait(stubborn))
    await asyncio.sleep(0.2)
    caller.cancel()
    await asyncio.wait([caller], timeout=2)
    assert caller.cancelled()
    stop.set()
    stubborn.cancel()
    await asyncio.wait([stubborn], timeout=2)
    assert stubborn.done()


async def test_cancel_and_wait_lets_a_cancelled_task_finish_its_cleanup():
    cleaned = []

    async def cleans_up_on_its_way_out() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.3)  # closing a socket, say: a second cancellation would cut this short
            cleaned.append(True)

    task = asyncio.create_task(cleans_up_on_its_way_out())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert cleaned == [True] and task.cancelled()
