"""A stream's sender is let go when its viewer leaves, even when the library it was in
dropped the cancellation.

Python 3.11's `asyncio.wait_for` (redis-py's connect and send use it) returns the
result of a call that finishes as the cancellation arrives, and the cancellation is
lost. A viewer's sender in that spot (the first Redis read of a stream whose client
left at once) went on waiting for the next event: the WebSocket handler never ended,
and kept its stream slot until the server's shutdown cancelled it with Redis closed.
"""

from __future__ import annotations

import asyncio
import sys

from app.api import streaming

ENDS_WITHIN_S = 5.0


async def test_a_sender_whose_cancellation_a_wait_for_dropped_is_let_go() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()
    carried_on = asyncio.Event()

    async def send() -> None:
        await asyncio.wait_for(answer, timeout=60)  # e.g. redis-py's connect
        carried_on.set()
        await asyncio.Event().wait()  # the next event, which never comes

    async def viewer_leaves() -> None:
        # The call finishes as the viewer goes: after this watcher has ended the race and
        # before the sender runs again, so that the sender's cancellation arrives with it.
        loop.call_soon(answer.set_result, "PONG")

    async with asyncio.timeout(ENDS_WITHIN_S):
        sender = await streaming.race(send(), viewer_leaves())
    assert sender is None  # the watcher ended it, and nothing is left running
    if sys.version_info < (3, 12):  # 3.12's wait_for keeps the cancellation
        assert carried_on.is_set(), "the cancellation was not dropped: not the case tested"
