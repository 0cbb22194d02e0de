"""Wire models of `POST /v1/tasks/batch`: many submissions, stored or refused together."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from app.schemas.tasks import TaskCreate, TaskOut, WireModel, check_text

BATCH_CEILING = 1000
"""The parsing ceiling of a batch; the server's `SANDHIVE_MAX_BATCH_TASKS` is at most this."""


class TaskBatchItem(TaskCreate):
    """One task of a batch: a task submission plus its own optional idempotency key."""

    idempotency_key: Annotated[str, AfterValidator(check_text)] | None = Field(
        default=None, min_length=1, max_length=200
    )
    """This task's Idempotency-Key: a repeat of the same task with it gets the first task
    back (not stored again), the same key with another task is a 422."""


class TaskBatchCreate(WireModel):
    """Tasks to queue at once: all are valid and admitted, or none is stored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tasks: list[TaskBatchItem] = Field(min_length=1, max_length=BATCH_CEILING)
    """The tasks, each as `POST /v1/tasks` takes it (plus `idempotency_key`)."""


class TaskBatchOut(WireModel):
    """The tasks of a batch, in the order they were sent."""

    tasks: list[TaskOut]
    """One per submitted task, in order (for a repeated key: the first task of that key)."""
    created: list[bool]
    """Per task, in order: false when an idempotency key repeat returned an existing task."""
