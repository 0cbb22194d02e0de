"""Experiments in their wire form: the row, with its progress counted in Postgres.

One place, so a read, a list page and the `experiment.finished` webhook send the same object.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.schemas.experiments import ArmOut, ArmProgress, ExperimentOut
from app.services.experiments.scoring import grading_of
from app.specs import WebhookSpec

Item = models.ExperimentItem
NOT_SCORED_KINDS = ("infrastructure", "scorer")
"""Errors that are the service's or the scorer's failure, not the agent's: no score at all."""


async def experiment_outs(
    session: AsyncSession, exps: list[models.Experiment]
) -> list[ExperimentOut]:
    """The wire form of a page of experiments: their progress in two grouped queries."""
    ids = [exp.id for exp in exps]
    if not ids:
        return []
    counts: dict[str, list[tuple[str, str, str | None, int]]] = defaultdict(list)
    for experiment_id, arm, status, kind, n in await session.execute(
        select(Item.experiment_id, Item.arm, Item.status, Item.error_kind, func.count())
        .where(Item.experiment_id.in_(ids))
        .group_by(Item.experiment_id, Item.arm, Item.status, Item.error_kind)
    ):
        counts[experiment_id].append((arm, status, kind, n))
    distinct_rows = await session.execute(
        select(Item.experiment_id, func.count(func.distinct(Item.row_id)))
        .where(Item.experiment_id.in_(ids))
        .group_by(Item.experiment_id)
    )
    rows = {experiment_id: int(n) for experiment_id, n in distinct_rows}
    return [experiment_out(exp, counts[exp.id], rows.get(exp.id, 0)) for exp in exps]


def experiment_out(
    exp: models.Experiment, counts: list[tuple[str, str, str | None, int]], rows: int
) -> ExperimentOut:
    """`counts`: (arm, status, error kind, items) of the experiment's items."""
    progress: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for arm, status, kind, n in counts:
        progress[arm][status] += n
        if status == "error" and kind in NOT_SCORED_KINDS:
            progress[arm]["not_scored"] += n
    arms = exp.spec["arms"]
    return ExperimentOut(
        id=exp.id,
        name=exp.name,
        status=exp.status,
        created_at=exp.created_at,
        finished_at=exp.finished_at,
        arms=[
            ArmOut(name=arm["name"], mode=arm["mode"], profile=arm.get("llm_profile"))
            for arm in arms
        ],
        scorer=exp.spec["scorer"],
        grading=grading_of(exp.spec),
        attempts=exp.spec["attempts"],
        concurrency=exp.spec["concurrency"],
        rows=rows,
        metadata=exp.meta,
        progress={arm["name"]: ArmProgress(**progress[arm["name"]]) for arm in arms},
        webhook=WebhookSpec.model_validate(exp.spec["webhook"]) if "webhook" in exp.spec else None,
        rules=exp.spec.get("rules", "sandhive"),
        infrastructure_retries=exp.spec.get("infrastructure_retries", 0),
    )
