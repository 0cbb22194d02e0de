"""`network.blocked`: a task's durable event for each connection the egress proxy refused.

Fenced like every write of an attempt (only while that attempt runs the task), so a
refusal reported late, after the task ended or moved on, is dropped rather than
appended to a finished task's history.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from app.db import models
from app.db.engine import Sessions
from app.services.events import record_events
from app.services.tasks.lifecycle import publish_quietly
from app.states import TaskStatus

NETWORK_BLOCKED = "network.blocked"


async def record_blocked(
    sessions: Sessions,
    redis: Redis,
    task_id: str,
    attempt: int,
    refusals: Sequence[tuple[str, str]],
) -> bool:
    """Store and publish refusals, each a (host, reason), in the order given, in one
    transaction; False when the attempt no longer runs the task."""
    owns = (models.Task.attempt == attempt) & (models.Task.status == TaskStatus.running)
    items = [
        (NETWORK_BLOCKED, {"host": host, "reason": reason, "attempt": attempt})
        for host, reason in refusals
    ]
    async with sessions.begin() as session:
        events = await record_events(session, task_id, items, only_if=owns)
    await publish_quietly(redis, events)
    return bool(events)
