"""Captures stored as deltas and rebuilt exactly (`app.domain.rollout_capture`), whatever the
requests and prompt ids share; and the GRPO group statistics."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.domain.rollout_capture import (
    ADVANTAGE_EPS,
    Compactor,
    flattened,
    group_stats,
    rebuild,
)


def capture(request: list[dict[str, Any]], answer: str, prompt: list[int] | None) -> dict[str, Any]:
    return {
        "request": request,
        "tools": [{"type": "function", "function": {"name": "submit"}}],
        "prompt_token_ids": prompt,
        "token_ids": [ord(c) for c in answer] if prompt is not None else None,
        "logprobs": [-0.5] * len(answer),
        "finish_reason": "stop",
        "response": {"role": "assistant", "content": answer},
    }


def test_append_only_prompts_store_only_their_new_ids_and_rebuild_exactly() -> None:
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}
    first = capture([system, user], "ab", [1, 2, 3])
    nudge = {"role": "user", "content": "go on"}
    second = capture([system, user, first["response"], nudge], "c", [1, 2, 3, 97, 98, 9, 9])
    compactor = Compactor()
    stored = [(0, compactor.compact(first)), (1, compactor.compact(second))]
    assert stored[1][1]["prompt_token_ids_from"] == 5
    assert stored[1][1]["prompt_token_ids"] == [9, 9]
    assert stored[1][1]["messages_from"] == 3
    assert stored[1][1]["messages"] == [nudge]
    rollout = rebuild(stored)
    assert rollout.messages == [system, user, first["response"], nudge, second["response"]]
    assert rollout.generated == [False, False, True, False, True]
    assert [t["prompt_token_ids"] for t in rollout.turns] == [[1, 2, 3], [1, 2, 3, 97, 98, 9, 9]]
    assert [t["request_messages"] for t in rollout.turns] == [2, 4]


def test_a_rewritten_history_is_stored_from_its_first_difference() -> None:
    system = {"role": "system", "content": "s"}
    first = capture([system, {"role": "user", "content": "u"}], "x", None)
    edited = [system, {"role": "user", "content": "u, edited"}]
    second = capture(edited, "y", None)
    compactor = Compactor()
    stored = [(0, compactor.compact(first)), (3, compactor.compact(second))]
    assert stored[1][1]["messages_from"] == 1
    rollout = rebuild(stored)
    assert rollout.messages == [*edited, second["response"]]
    assert rollout.generated == [False, False, True]
    assert [t["index"] for t in rollout.turns] == [0, 3]
    assert rollout.turns[1]["prompt_token_ids"] is None


def test_group_statistics_and_advantages() -> None:
    stats = group_stats([1.0, 0.0, 1.0, 1.0])
    std = math.sqrt(0.1875)
    assert (stats.n, stats.mean, stats.std) == (4, 0.75, pytest.approx(std))
    assert stats.advantage(0.0) == pytest.approx(-0.75 / (std + ADVANTAGE_EPS))
    assert stats.centered(1.0) == 0.25
    assert stats.advantage(None) is None
    same = group_stats([0.5, 0.5])
    assert (same.std, same.advantage(0.5)) == (0.0, 0.0)
    empty = group_stats([])
    assert (empty.n, empty.mean, empty.advantage(1.0)) == (0, None, None)


def test_a_continuous_rollout_flattens_into_one_sequence_and_its_mask() -> None:
    turns = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "logprobs": [-0.1, -0.2]},
        {"prompt_token_ids": [1, 2, 3, 4, 5], "completion_token_ids": [6], "logprobs": [-0.3]},
    ]
    sequence, broken = flattened(turns)
    assert broken is None
    assert sequence == {
        "token_ids": [1, 2, 3, 4, 5, 6],
        "loss_mask": [0, 0, 1, 1, 0, 1],
        "logprobs": [None, None, -0.1, -0.2, None, -0.3],
    }


def test_a_broken_boundary_or_missing_ids_give_no_sequence_and_say_where() -> None:
    drift = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": None},
        {"prompt_token_ids": [1, 2, 9, 5], "completion_token_ids": [6], "logprobs": None},
    ]
    assert flattened(drift) == (
        None,
        "turn 1's prompt does not start with turn 0's prompt and completion",
    )
    no_prompt = [{"prompt_token_ids": None, "completion_token_ids": [3], "logprobs": None}]
    assert flattened(no_prompt) == (None, "turn 0 has no token ids")
    assert flattened([]) == (None, "no model call")
