"""Which text an experiment's scorer judges for a task's end, under the experiment's rules.

Pure, shared by the service's runner (`app.services.experiments.runner`) and
`sandhive experiment run --local`, so both score the same text.

- `sandhive` rules: a submitted answer, as it is; any other end has no answer to judge (the
  agent's budget running out is an `agent` error, the service failing is not scored).
- `package` rules, those of `llm-in-sandbox benchmark` (REFERENCE.md §1.9): whatever ended
  the agent's run of its own doing (it submitted, or ran out of steps, context or time),
  the package reads `answer.txt` then and scores it, the empty text when there is none. A
  sandbox arm's answer is read as the package's `cat` reads it: through its runtime, which
  drops ANSI colour codes and carriage returns, then stripped; a vanilla arm's reply is
  scored whole, as the package scores `message.content`. The service's own failures are
  still not scored (the package scores them 0: docs/coming-from-llm-in-sandbox.md).
"""

from __future__ import annotations

import re

from app.states import FinishReason, TaskStatus

AGENT_REASONS = frozenset(
    {FinishReason.max_steps, FinishReason.context_limit, FinishReason.timeout}
)
"""Endings that are the agent's doing (its budget); the others are the infrastructure's."""
_ANSI_OR_CR = re.compile(r"\x1b\[[0-9;]*m|\r")
"""The package runtime's clean-up of a command's output (`DockerRuntime.run`)."""


def scored_answer(
    status: str, finish_reason: str | None, answer: str | None, *, package: bool, sandbox: bool
) -> str | None:
    """The text to score for a task that ended so, or None when its end is not scored on an
    answer (the module docstring's rules)."""
    if not package:
        return answer if status == TaskStatus.succeeded else None
    reason = FinishReason(finish_reason) if finish_reason else None
    if status != TaskStatus.succeeded and reason not in AGENT_REASONS:
        return None
    text = answer or ""
    return _ANSI_OR_CR.sub("", text).strip() if sandbox else text
