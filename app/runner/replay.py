"""A task forked by replay: the parent's recorded turns played to the loop again, each tool
call run again in a fresh sandbox and its answer checked against the record, then the
task's own model from the branch step on.

The loop runs unchanged (`app.agent.loop`): for its first `len(turns)` calls this model
answers with the parent's assistant messages as its model sent them (the loop repairs its
history's copy as it did for the parent), so the loop runs each recorded tool call in the
new sandbox as the parent's loop ran it, and appends what it observes. Each later call
first compares that observation (the first message after the newest assistant message, its
Steps Remaining suffix aside) with the recorded one (the tool's answer, or the nudge after
a turn without a usable call; the record as stored, so a NUL the store replaced is replaced
here too). The first difference raises `ReplayDiverged` with the step, both texts and a
diff (the task ends `replay_diverged`), unless divergence is allowed: then it is kept in
`divergence` and the replay goes on, the history holding what the new sandbox answered.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.agent.loop import (
    answers_all_calls,
    first_messages,
    mark_steps_left,
    replayable,
    turn_answers,
)
from app.agent.tools import NO_TOOL_CALL_NUDGE
from app.agent.types import (
    AgentSpec,
    ChatModel,
    Completion,
    DeltaCallback,
    Message,
    ToolSchema,
)
from app.errors import ReplayDiverged
from app.llm.openai import text_of
from app.llm.tool_calls import parse_tool_calls
from app.schemas.tasks import storable

SUFFIX = re.compile(r"\nSteps Remaining: \d+\Z")
DIFF_LINES = 40
SHOWN_CHARS = 2000


@dataclass(frozen=True)
class RecordedTurn:
    """One step of the parent: its assistant message and what its tool call observed."""

    message: Message
    observation: str


@dataclass(frozen=True)
class Divergence:
    """The first step whose replayed observation was not the recorded one."""

    step: int
    expected: str
    got: str

    def report(self) -> str:
        """Step, both texts (capped) and a unified diff: the task's `error`."""
        diff = difflib.unified_diff(
            self.expected.splitlines(),
            self.got.splitlines(),
            "recorded",
            "replayed",
            lineterm="",
        )
        shown = "\n".join(list(diff)[:DIFF_LINES])
        return (
            f"the replay diverged at step {self.step}: its tool answered otherwise than"
            f" recorded.\nrecorded: {self.expected[:SHOWN_CHARS]!r}\nreplayed:"
            f" {self.got[:SHOWN_CHARS]!r}\n{shown}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "expected": self.expected[:SHOWN_CHARS],
            "got": self.got[:SHOWN_CHARS],
        }


class ReplayModel:
    """A `ChatModel` that plays `turns`, then asks `model`."""

    def __init__(
        self, turns: Sequence[RecordedTurn], model: ChatModel, *, allow_divergence: bool
    ) -> None:
        self.turns, self.model = list(turns), model
        self.allow_divergence = allow_divergence
        self.calls = 0
        self.divergence: Divergence | None = None

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        index, self.calls = self.calls, self.calls + 1
        if 0 < index <= len(self.turns):
            self._check(index - 1, messages)
        if index < len(self.turns):
            return recorded_completion(self.turns[index].message)
        return await self.model.complete(messages, tools, on_delta)

    async def close(self) -> None:
        """Close the model it hands over to (an HTTP client's connections)."""
        close = getattr(self.model, "aclose", None)
        if close is not None:
            await close()

    def _check(self, step: int, messages: Sequence[Message]) -> None:
        expected = self.turns[step].observation
        got = observed(messages, nudged=expected == NO_TOOL_CALL_NUDGE)
        if storable(got) == expected or self.divergence is not None:
            return
        self.divergence = Divergence(step, expected, got)
        if not self.allow_divergence:
            raise ReplayDiverged(self.divergence.report(), details=self.divergence.as_json())


def observed(messages: Sequence[Message], *, nudged: bool) -> str:
    """What the newest step answered, Steps Remaining aside: the first message after the
    newest assistant message (its tool's answer), or, for a turn without a usable call, the
    last (the nudge, after any "not run" answers to its unusable calls)."""
    for at in range(len(messages) - 1, -1, -1):
        if messages[at].get("role") == "assistant":
            after = messages[at + 1 :]
            if not after:
                return ""
            answer = after[-1] if nudged else after[0]
            return SUFFIX.sub("", text_of(answer.get("content")))
    return ""


def history_at(spec: AgentSpec, turns: Sequence[RecordedTurn]) -> list[Message]:
    """The loop's history as it asks for step `len(turns)`, built from the record with
    nothing run (a fork whose sandbox comes from a snapshot): the same appends and Steps
    Remaining marks as the loop's (`app.agent.loop`), the observations as stored."""
    messages = first_messages(spec)
    mark_steps_left(messages, spec, 0)
    answer_all = answers_all_calls(spec)
    for index, turn in enumerate(turns):
        calls, _ = parse_tool_calls(turn.message.get("tool_calls"))
        messages.append(replayable(turn.message, spec.tools_profile))
        messages.extend(turn_answers(calls, turn.observation, answer_all, spec.tools_profile))
        mark_steps_left(messages, spec, index + 1)
    return messages


def recorded_completion(message: Message) -> Completion:
    """The loop's view of a recorded assistant message (as the model sent it: the loop
    repairs its history copy again, and runs its calls, malformed arguments and all, as
    the parent's loop did)."""
    calls, _ = parse_tool_calls(message.get("tool_calls"))
    return Completion(
        message=message,
        content=text_of(message.get("content")),
        reasoning=text_of(message.get("reasoning_content") or message.get("reasoning")),
        tool_calls=calls,
    )
