"""The episode rows a sweep looks at: the active ones that may have nobody behind them.

The API notices a lost worker only when the trainer calls again; an episode nobody
calls again (the trainer went away with its worker) would say `open` for ever and
count against its tenant's cap. These reads let a worker's sweep (`app.worker.
episodes_sweep`) find them; it ends them through `services.episodes.end`. So with a
submitted answer whose deferred scorer's worker died before it stored the reward
(`unscored`): the sweep stores the infrastructure error (`services.episodes_reward`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, or_, select, text

from app.db import models
from app.db.engine import Sessions
from app.services.episodes.service import ACTIVE

Row = models.EpisodeRow


async def open_by_worker(sessions: Sessions) -> dict[str, list[str]]:
    """Every `open` episode's id, by the worker its row says holds it."""
    async with sessions() as session:
        found = await session.execute(
            select(Row.worker, Row.id).where(Row.status == "open", Row.worker.is_not(None))
        )
        by_worker: dict[str, list[str]] = {}
        for worker, episode_id in found:
            by_worker.setdefault(str(worker), []).append(episode_id)
        return by_worker


async def unclaimed_since(
    sessions: Sessions, before: datetime, forks_before: datetime
) -> list[str]:
    """`opening` episodes created before `before` (a fork's children: `forks_before`, as
    their worker takes them only once their parent's snapshot is taken): no worker took
    them, and the API that waited for one (it ends them itself after its timeout) is gone."""
    opened = and_(Row.parent_id.is_(None), Row.created_at < before)
    forked = and_(Row.parent_id.is_not(None), Row.created_at < forks_before)
    async with sessions() as session:
        found = await session.scalars(
            select(Row.id).where(Row.status == "opening", or_(opened, forked))
        )
        return list(found)


async def unscored(sessions: Sessions, worker: str | None = None) -> dict[str, str]:
    """Ended episodes whose submitted answer has a deferred scorer and no reward yet (on
    `worker` only, when given): the scorer's kind by episode id. Most are being scored now;
    the caller checks their scoring lease (`app.bus.episodes.scoring`)."""
    query = select(Row.id, Row.scorer["kind"].astext).where(
        text(models.UNSCORED), Row.answer.is_not(None), Row.status.not_in(ACTIVE)
    )
    if worker is not None:
        query = query.where(Row.worker == worker)
    async with sessions() as session:
        return {episode_id: str(found) for episode_id, found in await session.execute(query)}
