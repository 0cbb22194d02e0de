"""Open episodes' step counts, written for many episodes in one transaction.

One Postgres transaction per step was a third of a worker's time with 128 episodes
stepping (bench/episodes.py); the count of an open episode is only informational (the
trainer keeps the conversation, and the end writes the exact count before its answer),
so a worker writes the counts that changed about once a second, all in one go.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import bindparam, update

from app.db import models
from app.db.engine import Sessions

Row = models.EpisodeRow


async def record_steps(sessions: Sessions, counts: Mapping[str, int]) -> None:
    """Set each open episode's step count; never lowers one, never touches an ended one
    (its end wrote the final count)."""
    if not counts:
        return
    statement = (
        update(Row.__table__)  # type: ignore[arg-type]
        .where(
            Row.__table__.c.id == bindparam("episode_id"),
            Row.__table__.c.status == "open",
            Row.__table__.c.steps < bindparam("count"),
        )
        .values(steps=bindparam("count"))
    )
    params = [{"episode_id": key, "count": count} for key, count in counts.items()]
    async with sessions.begin() as session:
        await session.execute(statement, params)
