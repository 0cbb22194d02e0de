"""The API's answers as typed objects.

Only the fields a caller commonly reads are declared; every other field the
server sends is kept (`extra="allow"`, read it as an attribute or with
`model_dump()`), so a newer server never breaks an older client.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Usage(_Model):
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Task(_Model):
    """A task: what was asked, where it is (`status`), and what came of it."""

    id: str
    status: str
    finish_reason: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    prompt: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    attempt: int = 0
    answer: str | None = None
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None

    @property
    def done(self) -> bool:
        """True once the task ended (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES


class TaskPage(_Model):
    """One page of the task list, newest first; `next_cursor` is None on the last page."""

    items: list[Task]
    next_cursor: str | None = None


class BatchResult(_Model):
    """A batch's tasks in the order sent; `created[i]` is False for an idempotent repeat."""

    tasks: list[Task]
    created: list[bool]


class Step(_Model):
    index: int
    attempt: int
    thought: str | None = None
    action: dict[str, Any] | None = None
    observation: str | None = None
    exit_code: int | None = None


class Trajectory(_Model):
    task_id: str
    steps: list[Step]


class Artifact(_Model):
    path: str
    size: int
    content_type: str
    sha256: str


class ArtifactList(_Model):
    items: list[Artifact]
    skipped: list[dict[str, Any]] = Field(default_factory=list)


class Event(_Model):
    """One event of a task's stream; `seq` counts from 1 without gaps (None: live-only)."""

    seq: int | None
    type: str
    ts: datetime
    task_id: str
    data: dict[str, Any] = Field(default_factory=dict)


class Experiment(_Model):
    id: str
    name: str
    status: str
    created_at: datetime
    finished_at: datetime | None = None
    arms: list[dict[str, Any]] = Field(default_factory=list)
    progress: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ExperimentPage(_Model):
    experiments: list[Experiment]
    next_cursor: str | None = None


class ExperimentItem(_Model):
    row_id: str
    arm: str
    attempt: int
    status: str
    score: float | None = None
    error_kind: str | None = None
    answer: str | None = None
    task_id: str | None = None
