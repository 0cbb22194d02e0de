"""What `/v1/episodes` accepts and answers (docs/rl.md).

An episode is a task without a model: the trainer's model answers each turn, so the
request carries everything a `TaskCreate` does except `llm`, `mode` and `metadata`,
plus the scorer and ground truth its reward is computed with.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from app.schemas.tasks import (
    MAX_INPUT_FILES,
    InputFile,
    JsonObject,
    Limits,
    Prompt,
    PromptConfigName,
    PromptPair,
    SandboxRequest,
    TaskCreate,
    ToolsOptions,
    WireModel,
    _Strict,
)


class EpisodeCreate(_Strict):
    """An environment to drive step by step: only `prompt` is required."""

    prompt: Prompt
    """The problem (the instance template's `{problem_statement}`)."""
    limits: Limits = Field(default_factory=Limits)
    """`max_steps` (the Steps Remaining count), `timeout_s` (the episode's wall clock,
    the trainer's thinking time included), `command_timeout_s`, `max_context_tokens`."""
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    """The sandbox's resources and network, as for a task."""
    tools: ToolsOptions = Field(default_factory=ToolsOptions)
    """The tools profile (`reference` for the package's exact observations), as for a task."""
    prompt_config: PromptConfigName | PromptPair = "general"
    """The system and instance prompts, by name or given whole, as for a task."""
    input_files: list[InputFile] = Field(default_factory=list, max_length=MAX_INPUT_FILES)
    """Files put under `/testbed/input/` before the first step, as for a task."""
    scorer: JsonObject | None = None
    """A scorer as an experiment's (`{"kind": "math"}`, `llm_judge`, `python`, ...) for
    `POST /v1/episodes/{id}/reward`; none: the reward route answers 409. A deferred one
    (`llm_judge`, `python`) runs in the worker before the final step answers."""
    ground_truth: Any = None
    """What the scorer compares the answer with (a string or a list of them)."""
    unsubmitted: Literal["zero", "answer_file"] = "zero"
    """The reward of an episode whose loop ended without `submit` (`max_steps`, `timeout`,
    `context_limit`): `zero`, the paper's rule for overlong episodes; or `answer_file`, its
    answer file scored as the paper's RL environment's `compute_final_reward` does whatever
    ended the loop (no file: 0). An episode closed mid-loop scores 0, and one the
    infrastructure ended is never scored, either way."""

    def as_task(self) -> TaskCreate:
        """The same request as a task, so it is resolved and checked exactly as one is."""
        return TaskCreate(
            prompt=self.prompt,
            limits=self.limits,
            sandbox=self.sandbox,
            tools=self.tools,
            prompt_config=self.prompt_config,
            input_files=self.input_files,
        )


class EpisodeStepIn(_Strict):
    """One turn of the trainer's model."""

    message: JsonObject
    """The assistant message in the OpenAI chat shape: `content`, optional `reasoning`
    (or `reasoning_content`), `tool_calls` (`[{"id", "type": "function", "function":
    {"name", "arguments"}}]`). Only the first call runs, as in the service's own loop."""


class EpisodeOut(WireModel):
    """An episode's state."""

    id: str
    """`epi_…`, for the step, reward and close routes."""
    status: str
    """`open`, `done` (the loop ended: submitted, max_steps, ...) or `closed`."""
    steps: int = 0
    """Assistant messages taken so far."""
    finish_reason: str | None = None
    """Why the loop ended (`submitted`, `max_steps`, `timeout`, `idle`, `worker_lost`, ...)."""
    error: str | None = None
    """What went wrong, when something did."""
    error_kind: str | None = None
    """`infrastructure` when the service ended it (its worker died, no answer in time,
    the sandbox failed): a trainer can mask such episodes out of its loss."""
    answer: str | None = None
    """The submitted answer (`output/answer.txt`), once the episode is done."""
    created_at: datetime
    """When the episode was opened."""
    ended_at: datetime | None = None
    """When the loop ended or the episode was closed."""
    parent_id: str | None = None
    """A fork's parent episode (`POST /v1/episodes/{id}/fork`); null for others."""
    fork_step: int | None = None
    """A fork's branch point: the steps its parent had taken, which it shares."""


class EpisodeOpened(EpisodeOut):
    """A new episode and its first observation."""

    messages: list[dict[str, Any]]
    """The system and first user message, exactly as the service's own loop sends them
    (the user message ends with `\\nSteps Remaining: N`)."""
    tools: list[dict[str, Any]]
    """The tool schemas to offer the model (OpenAI `tools` shape)."""


class EpisodeStepOut(WireModel):
    """What to append to the conversation after the trainer's assistant message."""

    messages: list[dict[str, Any]]
    """Tool results or the no-tool-call nudge; the newest carries the Steps Remaining
    suffix exactly as the loop appends it (none after the last step)."""
    done: bool
    """True when the loop ended with this turn: further steps answer 409."""
    finish_reason: str | None = None
    """Why the loop ended, when `done`."""
    error: str | None = None
    """What went wrong, when something did."""
    error_kind: str | None = None
    """`infrastructure` when the service, not the model, ended the episode."""
    timings: dict[str, int]
    """`tool_ms` (the tool's run in the sandbox) and `worker_ms` (the whole step in the
    worker); `api_ms` is this request end to end; `score_ms` (in `worker_ms`) on a final
    step whose deferred scorer (`llm_judge`, `python`) the worker ran."""


class RewardOut(WireModel):
    """The episode's reward from its scorer."""

    score: float
    """In [0, 1]."""
    reason: str | None = None
    """Why the score is 0 without being judged (never submitted, no answer)."""
    scorer: str
    """The scorer's kind."""
    finish_reason: str | None = None
    """Why the episode's loop ended."""
    detail: dict[str, Any] = Field(default_factory=dict)
    """What the scorer extracted and compared (an `llm_judge`'s prompt and exchanges, a
    `python` scorer's stdout, stderr and exit code)."""


class EpisodeForkIn(_Strict):
    """How many children to fork an open episode into."""

    n: int = Field(default=1, ge=1, le=1024)
    """Children (1 to `SANDHIVE_FORK_MAX_CHILDREN`, 64 by default)."""


class EpisodeForkOut(WireModel):
    """A fork's children, each opened from the parent's current step."""

    parent_id: str
    """The episode forked (it goes on, unchanged)."""
    step: int
    """The branch point: the steps the parent had taken (each child's `fork_step`)."""
    children: list[EpisodeOpened]
    """Each child as an open returns it, `messages` the parent's whole history so far,
    byte for byte; a child that could not start is `done` with `sandbox_error`
    (`error_kind: infrastructure`) and no messages."""
    timings: dict[str, int]
    """`snapshot_ms` (the parent's pause), `snapshot_bytes` (its writable files as a tar),
    `worker_ms` (the snapshot and every child's start), `api_ms` (this request)."""
