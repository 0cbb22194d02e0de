"""`app.kit.cancelling.stop` ends tasks that lost their cancel, and never leaves one running.

The swallowing task below plays Python 3.11's `asyncio.wait_for` (gh-86296), which redis-py's
connect and send use: the cancel that lands as the call finishes is dropped, and the task
goes on to its next await. Nothing of Sandhive is replaced.
"""

from __future__ import annotations

import asyncio

import pytest

from app.kit import cancelling

ENDS_WITHIN_S = 5.0


async def loses_its_first_cancel(entered: asyncio.Event) -> None:
    entered.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # dropped, as wait_for does when the call finished meanwhile
    await asyncio.sleep(3600)  # the next await: a loop's next read, a viewer's next event


async def test_a_task_that_lost_its_cancel_is_cancelled_again_until_it_ends() -> None:
    entered = asyncio.Event()
    task = asyncio.create_task(loses_its_first_cancel(entered))
    await entered.wait()
    async with asyncio.timeout(ENDS_WITHIN_S):
        await cancelling.stop([task])
    assert task.cancelled()


async def test_cancelled_while_stopping_it_still_waits_for_them_then_raises() -> None:
    entered = asyncio.Event()
    ended = asyncio.Event()

    async def child_work() -> None:
        try:
            await loses_its_first_cancel(entered)
        finally:
            ended.set()

    child = asyncio.create_task(child_work())
    await entered.wait()
    stopping = asyncio.create_task(cancelling.stop([child], every_s=0.05))
    await asyncio.sleep(0)  # it has cancelled the child once
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(ENDS_WITHIN_S):
            await stopping
    assert child.done(), "the child outlived its stop"
    assert ended.is_set()


async def test_a_tasks_error_does_not_escape_the_stop() -> None:
    async def fails() -> None:
        raise RuntimeError("a bug")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    async with asyncio.timeout(ENDS_WITHIN_S):
        await cancelling.stop([failed])
    assert isinstance(failed.exception(), RuntimeError)
