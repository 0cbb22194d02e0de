"""The wire models of rollouts for RL: GRPO groups in an experiment's results.

A leaf like `app.schemas.experiments`. The export's JSONL lines are documented field by
field in docs/rl.md ("Use Sandhive for RL"); they are plain JSON built by
`app.services.rollouts.export`, one object per rollout.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schemas.tasks import WireModel


class RolloutOut(WireModel):
    """One rollout (an attempt of a row under an arm) of a GRPO group."""

    attempt: int
    """The experiment attempt (1 to `attempts`), not the task's worker attempt."""
    task_id: str | None
    """Its task (null while it has not started)."""
    status: str
    """The item's status: `pending`, `running`, `scoring`, `scored`, `error`, `cancelled`."""
    reward: float | None
    """The score; 0 for an agent error (no answer, out of steps or time: the paper's rule);
    null when there is none to learn from (not finished, an infrastructure or scorer error,
    cancelled)."""
    infrastructure_failure: bool
    """The service failed, not the model (a worker lost, a sandbox or model-server error):
    mask it out of the loss. Its reward and advantage are null."""
    advantage: float | None
    """GRPO's (reward - mean) / (std + 1e-6) within the group; null without a reward."""
    advantage_centered: float | None
    """reward - mean (the variant without the std, as in Dr. GRPO); null without a reward."""


class GroupOut(WireModel):
    """A GRPO group: one dataset row under one arm, over the experiment's attempts."""

    group_id: str
    """`ARM:ROW_ID`; the export's `group_id`."""
    row_id: str
    """The dataset row."""
    arm: str
    """The arm."""
    n: int
    """Rollouts with a reward (the others are not counted in mean and std)."""
    mean: float | None
    """Mean reward of those; null when none has one yet."""
    std: float | None
    """Their population standard deviation (divided by n); null when none has a reward."""
    excluded: dict[str, int] = Field(default_factory=dict)
    """Rollouts left out of `n`, `mean` and `std`, by why: `infrastructure` (the service
    failed them, after the experiment's `infrastructure_retries` ran them again),
    `scorer` (every try to score them failed), `unfinished` (pending, running,
    being scored or cancelled). Empty when every rollout has a reward."""
    rollouts: list[RolloutOut]
    """Every attempt of the row under the arm, by attempt."""


ExportFormat = Literal["jsonl", "atif", "inspect"]
"""What `GET /v1/experiments/{id}/export?format=` takes."""
TaskExportFormat = Literal["jsonl", "atif"]
"""What `GET /v1/tasks/{id}/export?format=` takes."""
