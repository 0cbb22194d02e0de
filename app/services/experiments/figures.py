"""Experiments and their items by status, for the API's `/metrics`, counted in Postgres at
scrape time like the tasks' figures (`services.admin.task_figures`): the truth, whichever
worker or API process changed them. A scorer's time and errors are the worker's own
(`app.metrics`), where the scoring happens."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from app.db import models
from app.db.engine import Sessions

EXPERIMENT_STATUSES = ("running", "finished", "cancelled")
ITEM_STATUSES = ("pending", "running", "scoring", "scored", "error", "cancelled")


@dataclass(frozen=True)
class ExperimentFigures:
    experiments: dict[str, int]
    """Every status, 0 when none, so each series shows from the first scrape."""
    items: dict[str, int]


async def experiment_figures(sessions: Sessions) -> ExperimentFigures:
    exp, item = models.Experiment, models.ExperimentItem
    async with sessions() as session:
        experiments = dict(
            (await session.execute(select(exp.status, func.count()).group_by(exp.status))).all()
        )
        items = dict(
            (await session.execute(select(item.status, func.count()).group_by(item.status))).all()
        )
    return ExperimentFigures(
        experiments={s: int(experiments.get(s, 0)) for s in EXPERIMENT_STATUSES},
        items={s: int(items.get(s, 0)) for s in ITEM_STATUSES},
    )
