"""Stop tasks for good: cancel them and wait, cancelling again those that lost the cancel.

On Python 3.11 `asyncio.wait_for` (redis-py's connect and send use it) drops a cancel
that lands as the awaited call finishes (python/cpython gh-86296): the task carries on
to its next await. A loop stopped by one cancel then runs on for ever, and whoever
awaits its end hangs (a viewer's sender did, holding its WebSocket and stream slot).
`stop` cancels again until every task has ended; app/kit/periodic.py's loops check a flag
instead, which also keeps a job from starting after the stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RECANCEL_S = 0.1
"""How long a cancelled task may take to end before it is cancelled again."""


async def stop(tasks: Iterable[asyncio.Task[Any]], *, every_s: float = RECANCEL_S) -> None:
    """Cancel the tasks and wait until every one has ended, cancelling again every
    `every_s` those still running; their results and errors are dropped.

    A task's cleanup after its cancel must therefore survive being cancelled again (it
    gets `every_s` before that). Cancelled itself meanwhile, this still waits for them
    (a task left running would outlive what it uses), then raises the cancel.
    """
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    interrupted: asyncio.CancelledError | None = None
    while pending:
        for task in pending:
            task.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=every_s)
        except asyncio.CancelledError as exc:
            interrupted = exc
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at collection
    if interrupted is not None:
        raise interrupted
