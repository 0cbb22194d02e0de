"""The tenant rule, spelled once: another tenant's task is not found, never forbidden (inv. 6).

Every read or lock of a task row by id filters with `visible` and turns "no row"
into NotFound with `found`, so a missing task and another tenant's look the same.
A module of its own, below `services.events` (whose stream checks it) and
`services.lifecycle` (which locks with it), so neither imports the other.
"""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.errors import NotFound

R = TypeVar("R")


def visible(task_id: str, tenant: str | None) -> ColumnElement[bool]:
    """The row condition for `task_id` as `tenant` sees it; None sees every tenant's."""
    condition = models.Task.id == task_id
    if tenant is not None:
        condition = condition & (models.Task.tenant_id == tenant)
    return condition


def found(row: R | None, task_id: str) -> R:
    """The row, or NotFound: what a missing task and another tenant's both answer."""
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row


async def find_task(session: AsyncSession, tenant: str, task_id: str) -> models.Task:
    """The tenant's task, read without a lock; NotFound if missing or another tenant's."""
    return found(await session.scalar(select(models.Task).where(visible(task_id, tenant))), task_id)
