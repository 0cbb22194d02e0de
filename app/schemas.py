"""The v1 wire models: what clients send and receive (shared/API.md).

Structural bounds live here; server maxima, which depend on Settings, are
checked when a task is resolved (`services.tasks.resolve_spec`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.states import FinishReason, TaskStatus


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LLMOptions(_Strict):
    profile: str = Field(default="default", min_length=1, max_length=64)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens_per_call: int | None = Field(default=None, ge=1)
    extra_body: dict[str, Any] = Field(default_factory=dict)


class Limits(_Strict):
    max_steps: int | None = Field(default=None, ge=1)
    timeout_s: int | None = Field(default=None, ge=1)
    command_timeout_s: int | None = Field(default=None, ge=1)
    max_context_tokens: int | None = Field(default=None, ge=1024)


class SandboxRequest(_Strict):
    image: str = Field(default="default", min_length=1, max_length=200)
    network: Literal["none", "egress"] = "none"
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=64)


class ToolsOptions(_Strict):
    profile: Literal["standard", "reference"] = "standard"


class InputFile(_Strict):
    path: str = Field(min_length=1, max_length=1024)
    content_base64: str


class TaskCreate(_Strict):
    prompt: str = Field(min_length=1)
    llm: LLMOptions = Field(default_factory=LLMOptions)
    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    tools: ToolsOptions = Field(default_factory=ToolsOptions)
    prompt_config: Literal["general"] = "general"
    input_files: list[InputFile] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


# Resolved forms: every default filled in, every maximum checked. Stored with the task.


class LLMSpec(BaseModel):
    profile: str
    model: str
    temperature: float
    max_tokens_per_call: int
    extra_body: dict[str, Any] = Field(default_factory=dict)


class LimitsSpec(BaseModel):
    max_steps: int
    timeout_s: int
    command_timeout_s: int
    max_context_tokens: int


class SandboxSpec(BaseModel):
    image: str
    network: Literal["none", "egress"]
    cpus: float
    memory_mb: int


class TaskSpec(BaseModel):
    llm: LLMSpec
    limits: LimitsSpec
    sandbox: SandboxSpec
    tools: ToolsOptions
    prompt_config: str


class UsageOut(BaseModel):
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0


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
    tools: ToolsOptions
    prompt_config: str
    metadata: dict[str, Any]
    attempt: int
    answer: str | None
    usage: UsageOut
    error: str | None


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


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorOut(BaseModel):
    error: ErrorBody
