"""The episode rows a sweep looks at: the active ones that may have nobody behind them.

The API notices a lost worker only when the trainer calls again; an episode nobody
calls again (the trainer went away with its worker) would say `open` for ever and
count against its tenant's cap. These reads let a worker's sweep (`app.worker.
episodes_sweep`) find them; it ends them through `services.episodes.end`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions

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


async def unclaimed_since(sessions: Sessions, before: datetime) -> list[str]:
    """`opening` episodes created before `before`: no worker took them, and the API that
    waited for one (it ends them itself after its open timeout) is gone too."""
    async with sessions() as session:
        found = await session.scalars(
            select(Row.id).where(Row.status == "opening", Row.created_at < before)
        )
        return list(found)
