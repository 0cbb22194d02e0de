"""The hooks the state changes call: the event's payload is the object as GET returns it.

One line at each change (`lifecycle.finish_row`, `attempts._start`, the
experiment runner's end and cancel), inside its transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.domain.specs import WebhookSpec, read_spec
from app.services.tasks.service import task_out
from app.services.webhooks import service as webhooks


async def task_changed(session: AsyncSession, task: models.Task, event_type: str) -> None:
    """`task.started` or `task.finished` of this (locked, just changed) task."""

    def data() -> Any:
        return task_out(task).model_dump(mode="json")

    own = read_spec(task.spec).webhook
    await webhooks.enqueue(session, task.tenant_id, event_type, data, task_id=task.id, own=own)


async def experiment_finished(session: AsyncSession, exp: models.Experiment) -> None:
    """`experiment.finished` (its status says `finished` or `cancelled`)."""
    own_spec = exp.spec.get("webhook")
    own = WebhookSpec.model_validate(own_spec) if own_spec else None
    if own is None and not await webhooks.wanted(session, exp.tenant_id, "experiment.finished"):
        return
    # Imported here: services.experiments imports the runner that calls this hook.
    from app.services.experiments.service import experiment_out

    Item = models.ExperimentItem
    counts = [
        (arm, status, int(n))
        for arm, status, n in await session.execute(
            select(Item.arm, Item.status, func.count())
            .where(Item.experiment_id == exp.id)
            .group_by(Item.arm, Item.status)
        )
    ]
    rows = await session.scalar(
        select(func.count(func.distinct(Item.row_id))).where(Item.experiment_id == exp.id)
    )
    out = experiment_out(exp, counts, int(rows or 0))

    await webhooks.enqueue(
        session,
        exp.tenant_id,
        "experiment.finished",
        lambda: out.model_dump(mode="json"),
        experiment_id=exp.id,
        own=own,
    )
