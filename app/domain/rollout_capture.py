"""Captured model calls stored compactly, and the conversation they add up to.

A leaf (stdlib only): the worker's sink compacts each step's capture before it is
stored (`steps.capture`), the export (`app.services.rollouts.export`) rebuilds from
the stored rows. The loop's history is append-only (the Steps Remaining suffix goes
on the newest message before it is first sent, and stays), so a step stores only the
messages that are new since the previous step's request plus that step's answer:
`messages_from` says where they start. Nothing relies on the rule blindly: a step
whose request differs earlier (some other loop) stores from the first difference, and
the rebuild is exact either way. Prompt token ids are stored the same way: a prompt
usually starts with the previous prompt and completion, so a step keeps only the ids
after the shared start (`prompt_token_ids_from`); without it a 100-turn rollout would
store its prompt a hundred times.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ADVANTAGE_EPS = 1e-6
"""GRPO's epsilon in (r - mean) / (std + eps): a group whose rewards are all equal gets
advantage 0 for every rollout instead of a division by zero."""


@dataclass
class Compactor:
    """One attempt's captures, in step order: each stored as the delta to the one before."""

    _known: list[str] = field(default_factory=list)
    """The previous request and answer, each message as canonical JSON."""
    _tools: str | None = None
    _ids: list[int] = field(default_factory=list)
    """The previous prompt's token ids followed by its completion's."""

    def compact(self, capture: Mapping[str, Any]) -> dict[str, Any]:
        """What to store for this step's capture (see the module docstring)."""
        request = [_canonical(message) for message in capture["request"]]
        start = _common_prefix(self._known, request)
        tools = _canonical(capture.get("tools") or [])
        stored = {
            "messages_from": start,
            "messages": list(capture["request"][start:]),
            "response": capture.get("response"),
            **self._prompt_ids(capture.get("prompt_token_ids")),
            "token_ids": capture.get("token_ids"),
            "logprobs": capture.get("logprobs"),
            "finish_reason": capture.get("finish_reason"),
        }
        if tools != self._tools:
            stored["tools"] = capture.get("tools") or []
            self._tools = tools
        self._known = [*request, _canonical(capture.get("response") or {})]
        prompt, completion = capture.get("prompt_token_ids"), capture.get("token_ids")
        self._ids = [*prompt, *(completion or [])] if prompt is not None else []
        return stored

    def _prompt_ids(self, ids: Sequence[int] | None) -> dict[str, Any]:
        if ids is None:
            return {"prompt_token_ids": None}
        start = _common_prefix(self._ids, ids)
        return {"prompt_token_ids_from": start, "prompt_token_ids": list(ids[start:])}


@dataclass
class Rollout:
    """A captured attempt rebuilt: the whole conversation, its mask and one turn per call."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    """Per message: True when the model produced it, False when the environment did."""
    turns: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)


def rebuild(steps: Iterable[tuple[int, Mapping[str, Any]]]) -> Rollout:
    """The conversation of (step index, stored capture) pairs in step order."""
    out = Rollout()
    ids: list[int] = []
    for index, stored in steps:
        if "tools" in stored:
            out.tools = list(stored["tools"])
        del out.messages[int(stored["messages_from"]) :]
        del out.generated[int(stored["messages_from"]) :]
        new = [dict(message) for message in stored.get("messages") or []]
        out.messages.extend(new)
        out.generated.extend(False for _ in new)
        request_end = len(out.messages)
        response = stored.get("response")
        if response is not None:
            out.messages.append(dict(response))
            out.generated.append(True)
        prompt = stored.get("prompt_token_ids")
        if prompt is not None:
            prompt = [*ids[: int(stored.get("prompt_token_ids_from", 0))], *prompt]
            ids = [*prompt, *(stored.get("token_ids") or [])]
        out.turns.append(_turn(index, stored, request_end, response is not None, prompt))
    return out


def _turn(
    index: int,
    stored: Mapping[str, Any],
    request_end: int,
    answered: bool,
    prompt_ids: list[int] | None,
) -> dict[str, Any]:
    return {
        "index": index,
        "request_messages": request_end,
        "message_index": request_end if answered else None,
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": stored.get("token_ids"),
        "logprobs": stored.get("logprobs"),
        "finish_reason": stored.get("finish_reason"),
    }


def flattened(turns: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any] | None, str | None]:
    """One token sequence for the whole rollout, and its loss mask: the last prompt and
    completion, 1 on every token a model call sampled, 0 on what the environment added,
    with each sampled token's logprob (null elsewhere). Only when every turn's prompt
    starts with the previous turn's prompt and completion (token-continuous rollouts
    always do); otherwise None and why (the first turn that breaks it)."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    for n, turn in enumerate(turns):
        prompt, completion = turn.get("prompt_token_ids"), turn.get("completion_token_ids")
        if prompt is None or completion is None:
            return None, f"turn {n} has no token ids"
        if list(prompt[: len(ids)]) != ids:
            return (
                None,
                f"turn {n}'s prompt does not start with turn {n - 1}'s prompt and completion",
            )
        added = len(prompt) - len(ids)
        sampled = turn.get("logprobs")
        sampled = list(sampled) if sampled and len(sampled) == len(completion) else None
        ids += [*prompt[len(ids) :], *completion]
        mask += [0] * added + [1] * len(completion)
        logprobs += [None] * added + (sampled or [None] * len(completion))
    if not ids:
        return None, "no model call"
    return {"token_ids": ids, "loss_mask": mask, "logprobs": logprobs}, None


@dataclass(frozen=True)
class GroupStats:
    """One GRPO group's rewards (a dataset row under one arm, over its attempts)."""

    n: int
    mean: float | None
    std: float | None

    def advantage(self, reward: float | None) -> float | None:
        """(r - mean) / (std + eps); None for a rollout without a reward."""
        if reward is None or self.mean is None or self.std is None:
            return None
        return (reward - self.mean) / (self.std + ADVANTAGE_EPS)

    def centered(self, reward: float | None) -> float | None:
        """r - mean (Dr. GRPO's variant, no division by the std)."""
        if reward is None or self.mean is None:
            return None
        return reward - self.mean


def group_stats(rewards: Sequence[float]) -> GroupStats:
    """Mean and population standard deviation of a group's rewards (None when empty)."""
    if not rewards:
        return GroupStats(0, None, None)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return GroupStats(len(rewards), mean, std)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _common_prefix(known: Sequence[Any], request: Sequence[Any]) -> int:
    n = 0
    for a, b in zip(known, request, strict=False):
        if a != b:
            break
        n += 1
    return n
