"""The v1 wire models: what clients send and receive (shared/API.md).

Structural bounds live here; server maxima, which depend on Settings, are
checked when a task is resolved (`app.resolve`); the resolved, stored form is `app.specs`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.specs import LimitsSpec, LLMSpec, SandboxSpec, ToolsSpec
from app.states import FinishReason, TaskStatus

# Bounds on every input. These are hard ceilings that keep parsing and storage
# safe whatever the settings say; the configurable limits (Settings.max_prompt_chars,
# max_input_files, max_metadata_bytes ...) are checked by services.tasks.
MAX_INT = 2**31 - 1
MAX_TEXT_CHARS = 10_000_000
MAX_BASE64_CHARS = 2**30
MAX_INPUT_FILES = 10_000
MAX_JSON_KEYS = 1_000
MAX_JSON_DEPTH = 16
MAX_JSON_NODES = 20_000
RESERVED_EXTRA_BODY = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
    }
)
"""Request fields the server sets itself: `extra_body` may not override them."""


def check_text(value: str, where: str = "text") -> str:
    """Postgres stores neither NUL nor lone surrogates: refuse them as input (422, not 500)."""
    if "\x00" in value:
        raise ValueError(f"{where} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{where} is not valid Unicode (lone surrogate)") from exc
    return value


def storable(value: Any) -> Any:
    """`value` with every NUL in its strings replaced by U+FFFD, which Postgres can store.

    For what comes out of a sandbox or a model (observations, thoughts, tool arguments,
    answers): binary output is legitimate there, and must not crash the step's write.
    """
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable(item) for item in value]
    return value


def _walk_json(value: Any, where: str, depth: int, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"more than {MAX_JSON_NODES} values in all")
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{where} key")
            _walk_json(item, f"{where}.{key}"[:200], depth + 1, budget)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk_json(item, f"{where}[{i}]"[:200], depth + 1, budget)


def _bounded_json(value: dict[str, Any]) -> dict[str, Any]:
    _walk_json(value, "value", 0, [MAX_JSON_NODES])
    return value


def _no_reserved_keys(value: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_EXTRA_BODY & set(value))
    if reserved:
        raise ValueError(f"extra_body may not set {', '.join(reserved)}: the server sets them")
    return value


JsonObject = Annotated[
    dict[str, Any], Field(max_length=MAX_JSON_KEYS), AfterValidator(_bounded_json)
]
"""A small JSON object: bounded keys, depth and values; text that Postgres can store."""


class _Strict(BaseModel):
    # strict: no silent coercion of what clients send ("1" is not 1, 0 is not false)
    model_config = ConfigDict(extra="forbid", strict=True)


class LLMOptions(_Strict):
    profile: str = Field(default="default", min_length=1, max_length=64)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens_per_call: int | None = Field(default=None, ge=1, le=MAX_INT)
    extra_body: Annotated[JsonObject, AfterValidator(_no_reserved_keys)] = Field(
        default_factory=dict
    )


class Limits(_Strict):
    max_steps: int | None = Field(default=None, ge=1, le=MAX_INT)
    timeout_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    command_timeout_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    max_context_tokens: int | None = Field(default=None, ge=1024, le=MAX_INT)


class SandboxRequest(_Strict):
    image: str = Field(default="default", min_length=1, max_length=200)
    network: Literal["none", "egress"] = "none"
    cpus: float | None = Field(default=None, gt=0, le=1024)
    memory_mb: int | None = Field(default=None, ge=64, le=MAX_INT)
    disk_mb: int | None = Field(default=None, ge=16, le=MAX_INT)
    """Size of /testbed (RAM-backed); the server's default and maximum apply."""


class ToolsOptions(_Strict):
    profile: Literal["standard", "reference"] = "standard"
    answer_all_tool_calls: bool | None = None
    """Reply "not run" to every tool call after the first of a turn (strict APIs need it).
    None: the server default, else on for `standard` and off for `reference`."""
    shell: Literal["fresh", "persistent"] = "fresh"
    """execute_bash: a fresh shell per call, or (standard only) one shell kept for the task."""

    @field_validator("shell")
    @classmethod
    def _shell_fits_profile(cls, shell: str, info: ValidationInfo) -> str:
        if shell == "persistent" and info.data.get("profile") == "reference":
            raise ValueError(
                "the reference profile runs a fresh shell per call "
                "(shell must be fresh, or persistent with the standard profile)"
            )
        return shell


class InputFile(_Strict):
    path: str = Field(min_length=1, max_length=1024)
    content_base64: str = Field(max_length=MAX_BASE64_CHARS)


PromptConfigName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class PromptPair(_Strict):
    """A custom prompt config, with the package's placeholder rules (docs/agent.md)."""

    system: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    instance: str = Field(default="", max_length=MAX_TEXT_CHARS)
    """Empty: the prompt itself is the first user message."""
    working_dir: str | None = Field(default=None, max_length=1024)
    input_dir: str | None = Field(default=None, max_length=1024)
    output_dir: str | None = Field(default=None, max_length=1024)


class TaskCreate(_Strict):
    prompt: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    llm: LLMOptions = Field(default_factory=LLMOptions)
    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    tools: ToolsOptions = Field(default_factory=ToolsOptions)
    prompt_config: PromptConfigName | PromptPair = "general"
    input_files: list[InputFile] = Field(default_factory=list, max_length=MAX_INPUT_FILES)
    metadata: JsonObject = Field(default_factory=dict)
    mode: Literal["sandbox", "vanilla"] = "sandbox"
    """`vanilla`: the prompt (with the input files, as text, embedded) in one model call,
    no tools and no sandbox; the answer is the response text (docs/agent.md)."""

    @model_validator(mode="after")
    def _storable_text(self) -> TaskCreate:
        """Every string of the submission can be stored (metadata/extra_body check themselves)."""
        check_text(self.prompt, "prompt")
        check_text(self.llm.profile, "llm.profile")
        if self.llm.model is not None:
            check_text(self.llm.model, "llm.model")
        check_text(self.sandbox.image, "sandbox.image")
        for i, item in enumerate(self.input_files):
            check_text(item.path, f"input_files[{i}].path")
        if isinstance(self.prompt_config, PromptPair):
            for name, text in self.prompt_config.model_dump().items():
                if isinstance(text, str):
                    check_text(text, f"prompt_config.{name}")
        return self


class UsageOut(BaseModel):
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0


class SkippedArtifact(BaseModel):
    """An output file that is not among the artifacts, and why (a cap, a link, a special file).

    `path` is "" for a problem with the output as a whole (e.g. "more entries skipped").
    """

    path: str
    reason: str


class TaskOut(BaseModel):
    id: str
    status: TaskStatus
    finish_reason: FinishReason | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    prompt: str
    llm: LLMSpec
    limits: LimitsSpec
    sandbox: SandboxSpec
    tools: ToolsSpec
    prompt_config: str
    metadata: dict[str, Any]
    attempt: int
    answer: str | None
    usage: UsageOut
    error: str | None
    artifacts_skipped: list[SkippedArtifact] = Field(default_factory=list)
    """Output files left out of the artifacts; empty when every file was kept."""


class TaskList(BaseModel):
    items: list[TaskOut]
    next_cursor: str | None


class ActionOut(BaseModel):
    tool: str
    arguments: dict[str, Any]


class StepOut(BaseModel):
    index: int
    attempt: int
    thought: str
    reasoning: str
    action: ActionOut | None
    observation: str
    exit_code: int | None
    started_at: datetime
    llm_ms: int
    tool_ms: int
    prompt_tokens: int
    completion_tokens: int
    interrupted: str | None = None
    """Why the step ended before it was done (`cancelled`, `timeout`, `llm_error`,
    `sandbox_error`): its thought and observation are what was seen of it live.
    None for a step that ran to its end."""


class TrajectoryOut(BaseModel):
    task_id: str
    steps: list[StepOut]


class EventOut(BaseModel):
    seq: int | None
    type: str
    ts: datetime
    task_id: str
    data: dict[str, Any]


class ArtifactOut(BaseModel):
    path: str
    size: int
    content_type: str
    sha256: str


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    skipped: list[SkippedArtifact] = Field(default_factory=list)
    """Output files that are not in `items`, and why."""


class LLMProfileOut(BaseModel):
    """A server-side LLM profile as a tenant sees it: never its URL or key."""

    name: str
    kind: Literal["openai", "anthropic"]
    """Wire format."""
    model: str
    """The default model (a task's `llm.model` when it does not say)."""
    models: list[str]
    """Models a task may ask for; empty: any."""
    scripted: bool
    """A fixed script standing in for a model (the `scripted` demo profile)."""
    input_price_per_mtok: float | None = None
    output_price_per_mtok: float | None = None


class LLMProfileList(BaseModel):
    profiles: list[LLMProfileOut]
    notice: str | None = None
    """What to set when no real model is configured; null when one is."""


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorOut(BaseModel):
    error: ErrorBody
