"""The reference package's `trajectory.json` schema (REFERENCE.md §1.7), built from our steps.

A leaf module (stdlib only): `sandhive run` writes it next to `files/`, and
`GET /v1/tasks/{id}/trajectory?format=reference` returns it. Works on the agent's
`Step` and on the API's `StepOut` alike (same field names, seen through Protocols).
Exactly the package's keys: `problem_statement`, `steps[{thought,
reasoning_content, action{function, parameters}, observation, metadata{step,
exec_time}}]`, `metadata{total_steps}`; `exec_time` is the LLM call's seconds,
as in the package (tool time is in Sandhive's own trajectory format), and
`step` counts from 1 as the package's does (`step_count + 1` in its agent.py),
while Sandhive's own step indexes start at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class ActionLike(Protocol):
    @property
    def tool(self) -> str: ...

    @property
    def arguments(self) -> dict[str, Any]: ...


class StepLike(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def thought(self) -> str: ...

    @property
    def reasoning(self) -> str: ...

    @property
    def action(self) -> ActionLike | None: ...

    @property
    def observation(self) -> str: ...

    @property
    def llm_ms(self) -> int: ...


def reference_trajectory(prompt: str, steps: Sequence[StepLike]) -> dict[str, Any]:
    """The package's trajectory.json: problem_statement, steps[...], metadata.total_steps."""
    return {
        "problem_statement": prompt,
        "steps": [reference_step(step) for step in steps],
        "metadata": {"total_steps": len(steps)},
    }


def reference_step(step: StepLike) -> dict[str, Any]:
    """One step; a turn without a tool call has the package's empty action."""
    action = step.action
    return {
        "thought": step.thought,
        "reasoning_content": step.reasoning,
        "action": {
            "function": action.tool if action is not None else "",
            "parameters": action.arguments if action is not None else {},
        },
        "observation": step.observation,
        # The package records step_count + 1: its first step is 1, ours is index 0.
        "metadata": {"step": step.index + 1, "exec_time": step.llm_ms / 1000},
    }
