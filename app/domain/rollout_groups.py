"""An experiment's items as GRPO groups: per row x arm, reward mean, std and advantages.

Imported by `app.services.experiments.results` (the `groups` of results) and
`app.services.rollouts.export` (each line's group and advantage). Pure: it reads the
items it is given. The reward rule: a scored item's score; 0 for an agent error (the
model did not submit an answer in its budget, which a trainer must see as a failure);
nothing for infrastructure or scorer errors, cancelled or unfinished items, which
are kept out of the group's statistics (`infrastructure_failure` says which to mask).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from app.domain.rollout_capture import group_stats
from app.schemas.rollouts import GroupOut, RolloutOut


class Graded(Protocol):
    """What a group needs of an item (a current or an archived grading)."""

    @property
    def status(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def error_kind(self) -> str | None: ...
    @property
    def task_id(self) -> str | None: ...


@dataclass(frozen=True)
class Member:
    """An item's place in its group: row, arm and experiment attempt, and its grading."""

    row_id: str
    arm: str
    attempt: int
    graded: Graded


def group_id(arm: str, row_id: str) -> str:
    return f"{arm}:{row_id}"


def reward_of(item: Graded) -> float | None:
    """The module docstring's rule."""
    if item.status == "scored" and item.score is not None:
        return float(item.score)
    if item.status == "error" and item.error_kind == "agent":
        return 0.0
    return None


def is_infrastructure(item: Graded) -> bool:
    return item.status == "error" and item.error_kind == "infrastructure"


def why_excluded(item: Graded) -> str | None:
    """Why an item has no reward (`GroupOut.excluded`'s keys); None when it has one."""
    if reward_of(item) is not None:
        return None
    if item.status == "error":
        return str(item.error_kind or "infrastructure")
    return "unfinished"


def groups_of(members: Iterable[Member]) -> list[GroupOut]:
    """The groups, in the order their first member comes; rollouts by attempt."""
    by_group: dict[tuple[str, str], list[Member]] = {}
    for member in members:
        by_group.setdefault((member.arm, member.row_id), []).append(member)
    return [
        _group(arm, row, sorted(ms, key=lambda m: m.attempt)) for (arm, row), ms in by_group.items()
    ]


def rollouts_by_task(groups: Iterable[GroupOut]) -> Mapping[str, tuple[GroupOut, RolloutOut]]:
    """Each started rollout's group, by task id (for the export's lines)."""
    return {r.task_id: (g, r) for g in groups for r in g.rollouts if r.task_id is not None}


def _group(arm: str, row_id: str, members: list[Member]) -> GroupOut:
    rewards = [r for m in members if (r := reward_of(m.graded)) is not None]
    stats = group_stats(rewards)
    rollouts = [
        RolloutOut(
            attempt=m.attempt,
            task_id=m.graded.task_id,
            status=m.graded.status,
            reward=(reward := reward_of(m.graded)),
            infrastructure_failure=is_infrastructure(m.graded),
            advantage=stats.advantage(reward),
            advantage_centered=stats.centered(reward),
        )
        for m in members
    ]
    excluded: dict[str, int] = {}
    for m in members:
        if (why := why_excluded(m.graded)) is not None:
            excluded[why] = excluded.get(why, 0) + 1
    return GroupOut(
        group_id=group_id(arm, row_id),
        row_id=row_id,
        arm=arm,
        n=stats.n,
        mean=stats.mean,
        std=stats.std,
        excluded=excluded,
        rollouts=rollouts,
    )
