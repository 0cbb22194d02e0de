"""Which catalogue image a stored task runs: the queue stream it is enqueued on.

Every place that (re-)enqueues a task by id (reconciliation, an operator's requeue,
batches, experiments) asks here, so a task always goes back to its own image's stream
(`app.bus.queue`): a worker that lacks the image never sees it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions, one_statement
from app.domain.image_catalogue import DEFAULT


def image_name(spec: Mapping[str, Any]) -> str:
    """The image of a stored spec (`specs.stored` leaves out `default`, as older rows do)."""
    sandbox = spec.get("sandbox")
    name = sandbox.get("image_name") if isinstance(sandbox, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT


async def images_of(sessions: Sessions, task_ids: Collection[str]) -> dict[str, str]:
    """The image of each known task among task_ids (an unknown one is left out)."""
    if not task_ids:
        return {}
    query = select(models.Task.id, models.Task.spec).where(models.Task.id.in_(list(task_ids)))
    async with one_statement(sessions)() as session:  # a worker reads it at every claim
        rows = (await session.execute(query)).all()
    return {task_id: image_name(spec) for task_id, spec in rows}
