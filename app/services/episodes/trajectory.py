"""An ended episode as ATIF (Harbor's trajectory format), from the steps its worker wrote
as it ended (`EpisodeRow.trajectory`): the same document a task gives
(`app.domain.atif`), with the episode's prompt as the user's step, one agent step per model
turn the trainer sent, and the episode's end and reward in `extra`.

An open episode has no stored trajectory yet (its steps are written once, as it ends, so a
step costs no extra write): 409. One whose worker was lost before it ended never gets one:
404 saying so.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from app import __version__
from app.db import models
from app.db.engine import Sessions
from app.domain.atif import atif_trajectory
from app.errors import Conflict, NotFound
from app.services.episodes.service import ACTIVE, find

Episode = models.EpisodeRow


async def episode_atif(sessions: Sessions, tenant: str, episode_id: str) -> dict[str, Any]:
    """The tenant's ended episode as an ATIF trajectory (404 for another tenant's)."""
    row = await find(sessions, tenant, episode_id)
    if row.status in ACTIVE:
        raise Conflict(f"episode {episode_id} is {row.status}: its trajectory is kept once it ends")
    async with sessions() as session:
        stored = await session.scalar(select(Episode.trajectory).where(Episode.id == row.id))
    if stored is None:
        raise NotFound(f"episode {episode_id} has no stored trajectory (its worker was lost)")
    steps = [{**step, "started_at": datetime.fromisoformat(step["started_at"])} for step in stored]
    line = {
        "task_id": row.id,
        "model": None,
        "status": row.status,
        "finish_reason": row.finish_reason,
        "error": row.error,
        "infrastructure_failure": row.error_kind == "infrastructure",
        "answer": row.answer,
        "reward": (row.reward or {}).get("score"),
        "turns": [
            {
                "index": step["index"],
                "thought": step["thought"],
                "reasoning": step["reasoning"],
                "tool_call": step["action"],
                "observation": step["observation"],
                "interrupted": step["interrupted"],
            }
            for step in stored
        ],
    }
    found = atif_trajectory(line, row.prompt, steps, agent_version=__version__, worker_attempt=1)
    found["extra"].pop("task_id")
    found["extra"]["episode_id"] = row.id
    return found
