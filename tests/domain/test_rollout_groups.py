"""GRPO groups (`app.domain.rollout_groups`): who has a reward, what the statistics leave out
and why, so that a trainer never reads an infrastructure failure as a zero."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.domain.rollout_groups import Member, groups_of


@dataclass(frozen=True)
class Item:
    status: str
    score: float | None = None
    error_kind: str | None = None
    task_id: str | None = "tsk"


def test_the_statistics_leave_out_what_has_no_reward_and_say_why() -> None:
    items = [
        Item("scored", 1.0),
        Item("error", error_kind="agent"),  # the model's failure: a 0
        Item("error", error_kind="infrastructure"),
        Item("error", error_kind="scorer"),
        Item("running"),
        Item("scored", 1.0),
    ]
    members = [Member("q1", "arm", n, item) for n, item in enumerate(items, start=1)]
    (group,) = groups_of(members)
    assert (group.n, group.mean) == (3, pytest.approx(2 / 3))
    assert group.excluded == {"infrastructure": 1, "scorer": 1, "unfinished": 1}
    rewards = [r.reward for r in group.rollouts]
    assert rewards == [1.0, 0.0, None, None, None, 1.0]
    assert [r.infrastructure_failure for r in group.rollouts] == [
        False,
        False,
        True,
        False,
        False,
        False,
    ]
    (full,) = groups_of([Member("q2", "arm", 1, Item("scored", 0.5))])
    assert full.excluded == {}
