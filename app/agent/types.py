"""The seams of the agent: what it needs from a sandbox, a model and an event sink.

Drivers (`app.sandbox`, `app.llm`) implement these Protocols; the worker and
`sandhive run` provide sinks. Only stdlib and `app.states`/`app.errors` here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from app import defaults
from app.states import FinishReason

Message = dict[str, Any]
"""One chat message in OpenAI wire form (role, content, tool_calls, ...)."""

ToolSchema = dict[str, Any]
"""One tool in OpenAI function-calling form."""

OutputCallback = Callable[[str, bytes], Awaitable[None]]
"""Called with ("stdout" | "stderr", chunk) while a command runs."""

DeltaCallback = Callable[[str, str], Awaitable[None]]
"""Called with ("text" | "reasoning", fragment) while the model streams its answer."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    session_ended: bool = False
    """`Sandbox.shell` only: the session's shell is gone (the command exited it, or a
    timeout could not spare it); the next command starts a fresh one."""


class Sandbox(Protocol):
    """A running Linux computer the agent can run programs in."""

    async def exec(
        self,
        argv: Sequence[str],
        *,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
    ) -> ExecResult:
        """Run argv to completion; stdout and stderr kept apart. Raises SandboxError.

        linger_s: return this long after argv's own process exited even if a background
        child still holds stdout/stderr (that child gets SIGPIPE on its next write);
        None: collect until every writer has closed them.
        """
        ...

    async def shell(
        self,
        session: str,
        command: str,
        *,
        workdir: str,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
    ) -> ExecResult | None:
        """Run a bash command line in a persistent shell named session (cd, variables
        and functions carry over); None when this sandbox cannot keep one."""
        ...


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] | None
    """Decoded JSON object, or None when the model sent something that is not one."""
    raw_arguments: str = ""


@dataclass(frozen=True)
class Completion:
    """One model answer, as the loop needs it."""

    message: Message
    """The assistant message to append to history verbatim."""
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    capture: Mapping[str, Any] | None = None
    """With `llm.capture`: the exact request, token ids and logprobs (`app.llm.capture`)."""


class ChatModel(Protocol):
    """An LLM behind an OpenAI-compatible (or other) chat API."""

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        """One completion with tools offered. Raises LLMError after bounded retries.

        A model that streams calls `on_delta` with each fragment as it arrives.
        """
        ...


@dataclass(frozen=True)
class Action:
    tool: str
    arguments: dict[str, Any]


@dataclass
class Step:
    """One LLM turn and the tool call it made, as stored and streamed."""

    index: int
    started_at: datetime
    thought: str = ""
    reasoning: str = ""
    action: Action | None = None
    observation: str = ""
    exit_code: int | None = None
    llm_ms: int = 0
    tool_ms: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    interrupted: str | None = None
    """Why the step ended before it was done (a `FinishReason`: `cancelled`, `timeout`,
    `llm_error`, `sandbox_error`); its thought and observation are then what was seen
    live so far. None for a step that ran to its end."""
    capture: Mapping[str, Any] | None = None
    """The model call's capture (`Completion.capture`) when the task asked for one."""
    message: Message | None = None
    """The assistant message as the model sent it (the history holds it as `replayable`
    makes it): what a fork replays (`app.runner.replay`)."""


class EventSink(Protocol):
    """Where the loop reports progress: Postgres + Redis in the worker, a terminal locally."""

    async def step_started(self, index: int) -> None:
        """The first step begins (later ones are announced by `step_completed`)."""
        ...

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        """A step ended; `next_index` is the step that begins right away, None if the loop stops.

        Telling both at once lets the worker store a step and announce the next one
        in a single transaction (one per step on the hot path).
        """
        ...

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        """A live-only event (`llm.delta`, `tool.output`): may be dropped."""
        ...


@dataclass(frozen=True)
class AgentSpec:
    """Everything the loop needs to know about one task, already resolved and capped."""

    system_prompt: str
    user_prompt: str
    max_steps: int = defaults.MAX_STEPS
    timeout_s: float | None = None
    command_timeout_s: int = defaults.COMMAND_TIMEOUT_S
    max_context_tokens: int = defaults.MAX_CONTEXT_TOKENS
    tools_profile: str = "standard"
    tools_shell: str = "fresh"
    """execute_bash: "fresh" shell per call, or one "persistent" shell per task (standard)."""
    workdir: str = defaults.WORKDIR
    answer_all_tool_calls: bool | None = None
    """Answer every tool-call id of a turn (only the first is run) so strict APIs accept the
    history; None: the profile's default (on for `standard`, off for `reference`)."""


@dataclass(frozen=True)
class Resume:
    """Where a forked loop goes on from (`POST /v1/episodes/{id}/fork`): the history exactly
    as the model was last asked it (the newest message's Steps Remaining included) and the
    index of the step that request opens. The loop asks the model at once, running nothing
    again: the sandbox already holds what the earlier steps made."""

    messages: list[Message]
    index: int


@dataclass
class Usage:
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0


@dataclass
class Outcome:
    finish_reason: FinishReason
    steps: list[Step] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
