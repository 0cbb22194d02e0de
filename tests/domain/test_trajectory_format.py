"""The package's trajectory.json schema, from the agent's steps and from the API's steps.

metadata.step follows the package's rule (agent.py: `"step": step_count + 1`), so
our step index 0 is the package's step 1.
"""

from __future__ import annotations

from datetime import UTC, datetime

from app.agent.types import Action, Step
from app.domain.trajectory_format import reference_trajectory
from app.schemas.tasks import ActionOut, StepOut

NOW = datetime(2026, 1, 1, tzinfo=UTC)
EXPECTED = {
    "problem_statement": "Compute 6*7.",
    "steps": [
        {
            "thought": "Let me compute.",
            "reasoning_content": "Easy.",
            "action": {"function": "execute_bash", "parameters": {"command": "echo 42"}},
            "observation": "Exit code: 0\n...",
            "metadata": {"step": 1, "exec_time": 1.25},
        },
        {
            "thought": "I forgot the tool.",
            "reasoning_content": "",
            "action": {"function": "", "parameters": {}},
            "observation": "nudge",
            "metadata": {"step": 2, "exec_time": 0.0},
        },
    ],
    "metadata": {"total_steps": 2},
}


def test_agent_steps_and_stored_steps_give_the_same_reference_document() -> None:
    agent_steps = [
        Step(
            index=0,
            started_at=NOW,
            thought="Let me compute.",
            reasoning="Easy.",
            action=Action("execute_bash", {"command": "echo 42"}),
            observation="Exit code: 0\n...",
            llm_ms=1250,
            tool_ms=80,
        ),
        Step(index=1, started_at=NOW, thought="I forgot the tool.", observation="nudge"),
    ]
    stored = [
        StepOut(
            index=s.index,
            attempt=1,
            thought=s.thought,
            reasoning=s.reasoning,
            action=ActionOut(tool=s.action.tool, arguments=s.action.arguments)
            if s.action
            else None,
            observation=s.observation,
            exit_code=None,
            started_at=s.started_at,
            llm_ms=s.llm_ms,
            tool_ms=s.tool_ms,
            prompt_tokens=0,
            completion_tokens=0,
        )
        for s in agent_steps
    ]
    assert reference_trajectory("Compute 6*7.", agent_steps) == EXPECTED
    assert reference_trajectory("Compute 6*7.", stored) == EXPECTED
