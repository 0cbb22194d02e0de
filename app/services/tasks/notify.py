"""`task.started`, `task.expiring` and `task.finished`: the webhook events a task's changes
write to the outbox.

One line at each change (`lifecycle.finish_row`, `attempts._start`), inside its transaction;
the payload is the task as `GET /v1/tasks/{id}` returns it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.services.tasks.service import task_out
from app.services.webhooks import service as webhooks
from app.specs import read_spec


async def task_changed(
    session: AsyncSession, task: models.Task, event_type: str, expires_at: datetime | None = None
) -> None:
    """`task.started`, `task.expiring` (with `expires_at`, when its time runs out) or
    `task.finished` of this (locked) task."""

    def data() -> Any:
        found = task_out(task).model_dump(mode="json")
        if expires_at is not None:
            found["expires_at"] = expires_at.isoformat()
        return found

    own = read_spec(task.spec).webhook
    await webhooks.enqueue(session, task.tenant_id, event_type, data, task_id=task.id, own=own)
