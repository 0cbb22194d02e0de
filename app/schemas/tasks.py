"""The v1 wire models: what clients send and receive (shared/API.md).

Structural bounds live here; server maxima, which depend on Settings, are
checked when a task is resolved (`app.domain.resolve`); the resolved, stored form is
`app.specs`.
"""

from __future__ import annotations

import functools
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

from app.specs import LimitsSpec, LLMSpec, SandboxSpec, ToolsSpec, WebhookSpec
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


def not_blank(value: str) -> str:
    """A prompt of only whitespace asks the model nothing: refuse it as the page does."""
    if not value.strip():
        raise ValueError("must hold some text, not only whitespace")
    return value


Prompt = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS), AfterValidator(not_blank)]
"""A task's or an episode's prompt: not empty, not only whitespace, within the size cap."""


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


class WireModel(BaseModel):
    """A wire model: the docstring under each field is its description in /openapi.json."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class _Strict(WireModel):
    # strict: no silent coercion of what clients send ("1" is not 1, 0 is not false)
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        """A whole-number field takes `5.0` as 5. JSON Schema's `integer` admits it (JSON has
        one number type, and some encoders write every number with a point), so a schema-valid
        request must not be refused for it; `5.5`, `"5"` and `true` still are."""
        if not isinstance(data, dict):
            return data
        whole = _whole_number_fields(cls)
        if not any(isinstance(data.get(name), float) for name in whole):
            return data
        return {
            name: int(value)
            if name in whole and isinstance(value, float) and value.is_integer()
            else value
            for name, value in data.items()
        }


@functools.cache
def _whole_number_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` typed `int` or `int | None`."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if field.annotation is int or field.annotation == int | None
    )


class LLMOptions(_Strict):
    """Which model answers the task, and how it is called."""

    profile: str = Field(default="default", min_length=1, max_length=64)
    """A server-side LLM profile (`GET /v1/llm/profiles` lists them); its URL and key stay
    on the server. `scripted` is the built-in demo (when `SANDHIVE_SCRIPTED_PROFILE=true`)."""
    model: str | None = Field(default=None, min_length=1, max_length=200)
    """A model the profile allows; null: the profile's default model."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature; null: the server's default (`SANDHIVE_DEFAULT_TEMPERATURE`)."""
    max_tokens_per_call: int | None = Field(default=None, ge=1, le=MAX_INT)
    """`max_tokens` of each model call; null: the server's default."""
    extra_body: Annotated[JsonObject, AfterValidator(_no_reserved_keys)] = Field(
        default_factory=dict
    )
    """Extra fields for each request to the model (provider options such as `top_p`);
    never one the server sets itself (`model`, `messages`, `max_tokens`, ...)."""
    base_url: str | None = Field(default=None, min_length=1, max_length=2000)
    """The model server of this rollout (a trainer's own, docs/rl.md): one of the operator's
    `SANDHIVE_LLM_ALLOWED_BASE_URLS` (anything else is a 422); the profile's key is sent.
    Null: the profile's URL."""
    capture: bool = False
    """Ask for and store per step the sampled tokens' log-probabilities (`logprobs`), the
    prompt and completion token ids where the server returns them (vLLM's and SGLang's
    `return_token_ids`) and the exact request messages, for `GET .../export` (RL)."""
    tokens: Literal["chat", "continuous"] = "chat"
    """`chat`: each turn is a chat completion. `continuous`: the service keeps the rollout's
    token sequence and asks the server's completions endpoint to continue it, so every
    turn's prompt starts with the previous prompt and completion token for token (a
    server with llama.cpp's `/apply-template` and `/tokenize`; implies `capture`; docs/rl.md)."""


class Limits(_Strict):
    """When the task stops; each null is the server's default."""

    max_steps: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Model turns before the task ends with `max_steps`; null: the server's default."""
    timeout_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Wall-clock seconds for the whole task (then it ends with `timeout`); null: the
    server's default."""
    command_timeout_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Seconds one tool command may run before it is stopped; null: the server's default."""
    max_context_tokens: int | None = Field(default=None, ge=1024, le=MAX_INT)
    """Conversation budget in tokens (past it the task ends with `context_limit`); null:
    the server's default."""


class SandboxRequest(_Strict):
    """The container the agent's commands run in."""

    image: str = Field(default="default", min_length=1, max_length=200)
    """A catalogue image by name (`GET /v1/images` lists those this tenant may use);
    `default` is the server's own sandbox image."""
    network: Literal["none", "egress"] = "none"
    """`none`: no network at all; `egress`: outbound internet but never the service's own
    hosts (422 unless the server enables it)."""
    cpus: float | None = Field(default=None, gt=0, le=1024)
    """CPU cores; null: the image's default (its maximum applies)."""
    memory_mb: int | None = Field(default=None, ge=64, le=MAX_INT)
    """Memory in MiB; null: the image's default (its maximum applies)."""
    disk_mb: int | None = Field(default=None, ge=16, le=MAX_INT)
    """Size of /testbed (RAM-backed); the image's default and maximum apply."""
    allow_domains: list[Annotated[str, Field(min_length=1, max_length=255)]] | None = Field(
        default=None, max_length=200, examples=[["pypi.org", "*.pythonhosted.org"]]
    )
    """With `egress` on a server that filters by name: the names (`pypi.org`) and `*.suffix`
    patterns the sandbox may reach through the proxy, within the server's list (422 naming
    it otherwise); null: the server's default list (docs/network.md)."""
    read_only_rootfs: bool = True
    """The image's own files read-only, only the workdir and the scratch directories (/tmp,
    /root, …) writable. `false` (a Harbor task's agent writes /app, say) only where the
    operator allows it (`SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS`; 422 otherwise): the
    writable layer lies on the Docker host's disk, which no quota bounds."""
    snapshots: Literal["off", "steps"] = "off"
    """`steps`: a task stores its sandbox's writable files after every step, so that it can
    be forked from any step without replaying its commands (`POST /v1/tasks/{id}/fork`,
    `rebuild: snapshot`; docs/fork.md). Each costs a pause and the files' size in Postgres
    (up to `SANDHIVE_SNAPSHOT_MAX_MB`). Episodes fork live and ignore it."""


class ToolsOptions(_Strict):
    """The agent's tools and how its tool calls are answered (docs/agent.md)."""

    # `reference` runs a fresh shell per call, said in the schema as well.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["profile"], "properties": {"profile": {"const": "reference"}}},
            "then": {"properties": {"shell": {"const": "fresh"}}},
        }
    )

    profile: Literal["standard", "reference"] = "standard"
    """`standard`: Sandhive's tools; `reference`: observations byte-identical to the paper's
    package."""
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
    """A file put into the sandbox before the agent starts."""

    path: str = Field(min_length=1, max_length=1024)
    """Where it lands, relative to the prompt config's input directory (/testbed/input)."""
    content_base64: str = Field(max_length=MAX_BASE64_CHARS)
    """Its bytes, base64-encoded."""


PromptConfigName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class PromptPair(_Strict):
    """A custom prompt config, with the package's placeholder rules (docs/agent.md)."""

    system: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    """The system prompt template (`{working_dir}`, `{input_dir}`, `{output_dir}` replaced)."""
    instance: str = Field(default="", max_length=MAX_TEXT_CHARS)
    """Empty: the prompt itself is the first user message."""
    working_dir: str | None = Field(default=None, max_length=1024)
    """The agent's working directory in the sandbox; null: /testbed."""
    input_dir: str | None = Field(default=None, max_length=1024)
    """Where input files land; null: /testbed/input."""
    output_dir: str | None = Field(default=None, max_length=1024)
    """Where artifacts are collected from; null: /testbed/output."""


TASK_EXAMPLES: dict[str, dict[str, Any]] = {
    "scripted": {
        "summary": "The built-in scripted demo model (no real model needed)",
        "description": "Needs `SANDHIVE_SCRIPTED_PROFILE=true` (`make run` sets it).",
        "value": {
            "prompt": "Compute the 10th Catalan number and write it to answer.txt",
            "llm": {"profile": "scripted", "model": "demo"},
        },
    },
    "everything": {
        "summary": "Most options, on the server's `default` profile",
        "value": {
            "prompt": "Sum the numbers in data/numbers.txt and write the sum to answer.txt",
            "llm": {"profile": "default", "temperature": 0.7},
            "limits": {"max_steps": 30, "timeout_s": 600, "command_timeout_s": 120},
            "sandbox": {"network": "none", "cpus": 1.0, "memory_mb": 1024},
            "tools": {"profile": "standard"},
            "input_files": [{"path": "data/numbers.txt", "content_base64": "MSAyIDMK"}],
            "metadata": {"ticket": 42},
        },
    },
}
"""Named examples of `POST /v1/tasks` (OpenAPI's; tests/api/test_openapi.py submits them)."""


class Verifier(_Strict):
    """Harbor's verifier: files put under /tests once the agent has ended, then a command run
    in the same sandbox as root, whose reward file is the task's reward (docs/api.md#verifier)."""

    files: list[InputFile] = Field(min_length=1, max_length=MAX_INPUT_FILES)
    """Its files (Harbor's `tests/` folder), by path under /tests; unseen by the agent."""
    command: str = Field(default="bash /tests/test.sh", min_length=1, max_length=4096)
    """Run by `bash -c` in /tests after the agent; it writes /logs/verifier/reward.txt (a
    number) or reward.json (`{"reward": number}`)."""
    timeout_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Seconds the command may run; null: `SANDHIVE_VERIFIER_DEFAULT_TIMEOUT_S`, at most
    `SANDHIVE_VERIFIER_MAX_TIMEOUT_S`."""


class TaskWebhook(_Strict):
    """Where this task's own events go, besides the tenant's subscriptions."""

    url: Annotated[str, Field(max_length=2000), AfterValidator(check_text)]
    """The http(s) URL that receives the POSTs: checked like a subscription's (a public
    address, unless `SANDHIVE_WEBHOOK_ALLOWED_HOSTS` allows it)."""
    events: list[Literal["task.started", "task.finished"]] = Field(
        default=["task.finished"], min_length=1, max_length=2
    )
    """Which of the task's events to send there (`task.started`, `task.finished`)."""


class TaskCreate(_Strict):
    """A task to run: only `prompt` is required; every other field has a server default."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [example["value"] for example in TASK_EXAMPLES.values()]}
    )

    prompt: Prompt
    """The problem for the agent (the instance template's `{problem_statement}`)."""
    llm: LLMOptions = Field(default_factory=LLMOptions)
    """Which model, and how it is called."""
    limits: Limits = Field(default_factory=Limits)
    """When the task stops."""
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    """Its container: image, network, CPUs, memory and disk."""
    tools: ToolsOptions = Field(default_factory=ToolsOptions)
    """The agent's tools."""
    prompt_config: PromptConfigName | PromptPair = "general"
    """A prompt config by name (`general`, a domain's, or one of the server's configs
    directory), or a custom `{system, instance, ...}` pair (docs/agent.md)."""
    input_files: list[InputFile] = Field(default_factory=list, max_length=MAX_INPUT_FILES)
    """Files put into the sandbox first (or send them as multipart/form-data parts)."""
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object the caller wants back with the task; the task list filters on it
    (`?metadata.KEY=VALUE`)."""
    mode: Literal["sandbox", "vanilla"] = "sandbox"
    """`vanilla`: the prompt (with the input files, as text, embedded) in one model call,
    no tools and no sandbox; the answer is the response text (docs/agent.md)."""
    webhook: TaskWebhook | None = None
    """This task's own webhook: signed with the secret of the tenant's newest subscription
    (so the tenant needs one: `POST /v1/webhooks`)."""
    verifier: Verifier | None = None
    """A check run in the task's sandbox after the agent ends (a vanilla task: in a fresh
    sandbox of its image, the reply as output/answer.txt); its reward is the task's
    `verification` (docs/api.md#verifier)."""

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
        if self.verifier is not None:
            check_text(self.verifier.command, "verifier.command")
            for i, item in enumerate(self.verifier.files):
                check_text(item.path, f"verifier.files[{i}].path")
        if isinstance(self.prompt_config, PromptPair):
            for name, text in self.prompt_config.model_dump().items():
                if isinstance(text, str):
                    check_text(text, f"prompt_config.{name}")
        return self


class UsageOut(WireModel):
    """What the task used, stored when it ends: a task still queued or running reports
    zeros here (its progress so far is in its events: `step.completed`, `llm.delta`)."""

    steps: int = 0
    """Steps taken."""
    prompt_tokens: int = 0
    """Prompt tokens over every model call, as the provider counted them."""
    completion_tokens: int = 0
    """Completion tokens over every model call."""
    llm_seconds: float = 0.0
    """Seconds spent waiting on the model."""
    sandbox_seconds: float = 0.0
    """Seconds spent running tools in the sandbox."""


class SkippedArtifact(WireModel):
    """An output file that is not among the artifacts, and why (a cap, a link, a special file).

    `path` is "" for a problem with the output as a whole (e.g. "more entries skipped").
    """

    path: str
    """The file, relative to the output directory; "" for the output as a whole."""
    reason: str
    """Why it was left out."""


class VerificationOut(WireModel):
    """What the task's verifier found, once it has run."""

    reward: float | None
    """The reward it wrote (reward.txt's number, or reward.json's `reward`, or its one value);
    null when it wrote none that reads as a number (`error` says why)."""
    rewards: dict[str, float] = Field(default_factory=dict)
    """Every named reward of a reward.json (`{"reward": r}` for a reward.txt)."""
    error: str | None = None
    """Why there is no reward: no reward file, not a number, the command timed out."""
    infrastructure: bool = False
    """True when the service failed to run it (its sandbox could not start or answer): not
    the answer's fault, and an experiment does not score it."""
    exit_code: int | None = None
    """The command's exit status (-1 when it timed out); null if it did not run."""
    stdout: str = ""
    """The end of its standard output (`SANDHIVE_VERIFIER_OUTPUT_BYTES`)."""
    stderr: str = ""
    """The end of its standard error."""
    seconds: float = 0.0
    """How long it ran, file copies and reward read included."""


class TaskOut(WireModel):
    """A task: what was asked (every default resolved), where it is, and what came of it."""

    id: str
    """`tsk_` and a ULID."""
    status: TaskStatus
    """`queued`, `running`, then `succeeded` (the agent submitted), `failed` or `cancelled`."""
    finish_reason: FinishReason | None
    """Why it ended: `submitted`, `max_steps`, `timeout`, `context_limit`, `llm_error`,
    `sandbox_error`, `cancelled` or `worker_lost`; null until it has."""
    created_at: datetime
    """When it was submitted."""
    started_at: datetime | None
    """When a worker started it; null while queued."""
    finished_at: datetime | None
    """When it ended; null until it has."""
    prompt: str
    """The prompt, as submitted."""
    llm: LLMSpec
    """The LLM options as resolved at submit time (defaults filled in)."""
    limits: LimitsSpec
    """The limits as resolved at submit time."""
    sandbox: SandboxSpec
    """The sandbox as resolved at submit time (`image`: the server's image)."""
    tools: ToolsSpec
    """The tool options as resolved at submit time."""
    prompt_config: str
    """The prompt config's name (`custom` for a submitted pair)."""
    mode: Literal["sandbox", "vanilla"] = "sandbox"
    """`vanilla`: one model call, no tools and no sandbox (an experiment's baseline arm)."""
    metadata: dict[str, Any]
    """The submission's `metadata`."""
    attempt: int
    """1, plus one each time the task ran again after its worker was lost."""
    answer: str | None
    """The text of the output directory's answer.txt when the agent wrote one (capped at
    `SANDHIVE_ANSWER_MAX_BYTES`); null otherwise."""
    usage: UsageOut
    """Steps, tokens and time so far."""
    error: str | None
    """What went wrong, in words, when the task did not succeed; null otherwise."""
    artifacts_skipped: list[SkippedArtifact] = Field(default_factory=list)
    """Output files left out of the artifacts; empty when every file was kept."""
    webhook: WebhookSpec | None = None
    """The task's own webhook (`signed_by`: the subscription whose secret signs it); null
    without one."""
    verification: VerificationOut | None = None
    """What its verifier found; null without a verifier, or until it has run."""
    fork: ForkOut | None = None
    """Where a fork (`POST /v1/tasks/{id}/fork`) started from; null for other tasks."""


class ForkOut(WireModel):
    """A forked task's origin, and where its replay diverged if it was allowed to."""

    parent_id: str
    """The task it was forked from."""
    step: int
    """The steps of the parent it replayed; its own model took over at this step."""
    allow_divergence: bool
    """Whether it went on past a replayed tool answer that differed from the record."""
    rebuild: Literal["replay", "snapshot"] = "replay"
    """How its sandbox was rebuilt (`TaskForkIn.rebuild`)."""
    diverged: dict[str, Any] | None = None
    """Where the replay diverged when that was allowed (`step`, `expected`, `got`); null
    when every replayed step answered as recorded (or the fork stopped there:
    `finish_reason: replay_diverged`, the report in `error`)."""


class TaskForkIn(_Strict):
    """Fork a task from one of its steps: new tasks that replay its steps before `step` in a
    fresh sandbox, then go on with a model (its own, or the one given)."""

    step: int = Field(ge=0, le=MAX_INT)
    """How many of the parent's steps to replay; its model is first asked for step `step`
    (0: from the start, with the parent's prompt and inputs)."""
    n: int = Field(default=1, ge=1, le=1024)
    """Children (1 to `SANDHIVE_FORK_MAX_CHILDREN`)."""
    rebuild: Literal["replay", "snapshot"] = "replay"
    """How the sandbox is rebuilt: `replay`, the recorded tool calls run again in order,
    each answer compared with the stored one; `snapshot`, the files the parent stored after
    the step before the branch (it ran with `sandbox.snapshots: steps`), nothing run again."""
    allow_divergence: bool = False
    """Go on past a replayed answer that differs from the record (the child says where
    in `fork.diverged`); by default the child stops there, `replay_diverged`."""
    llm: LLMOptions | None = None
    """Another model for the child (as a task's `llm`); none: the parent's."""
    limits: Limits | None = None
    """Other limits for the child (as a task's `limits`, defaults filled again); none: the
    parent's."""

    @model_validator(mode="after")
    def _storable_text(self) -> TaskForkIn:
        """The model's names are stored with the child: no NUL, no lone surrogate (422)."""
        if self.llm is not None:
            check_text(self.llm.profile, "llm.profile")
            if self.llm.model is not None:
                check_text(self.llm.model, "llm.model")
        return self


class TaskForkOut(WireModel):
    """A fork's children, queued."""

    parent_id: str
    """The task forked."""
    step: int
    """The branch point."""
    tasks: list[TaskOut]
    """The children, as `POST /v1/tasks` returns a task."""


class TaskList(WireModel):
    """A page of the tenant's tasks."""

    items: list[TaskOut]
    """Newest first."""
    next_cursor: str | None
    """Pass back as `cursor` for the next page; null on the last one."""


class ActionOut(WireModel):
    """The tool call of a step."""

    tool: str
    """The tool the model called (`execute_bash`, `str_replace_editor`, `submit`, ...)."""
    arguments: dict[str, Any]
    """Its arguments, as the model sent them."""


class StepOut(WireModel):
    """One step of the agent: a model turn and the tool call it made."""

    index: int
    """Position in its attempt, from 0 (the page shows it plus one)."""
    attempt: int
    """The attempt it belongs to."""
    thought: str
    """The text the model wrote."""
    reasoning: str
    """The model's reasoning content, when it returns one; "" otherwise."""
    action: ActionOut | None
    """The tool call; null when the model made none."""
    observation: str
    """What the tool returned to the model."""
    exit_code: int | None
    """The command's exit code; null for a tool that is not a command, or one that did not
    finish."""
    started_at: datetime
    """When the step started."""
    llm_ms: int
    """Milliseconds of the model call."""
    tool_ms: int
    """Milliseconds of the tool call."""
    prompt_tokens: int
    """Prompt tokens of the model call."""
    completion_tokens: int
    """Completion tokens of the model call."""
    interrupted: str | None = None
    """Why the step ended before it was done (`cancelled`, `timeout`, `llm_error`,
    `sandbox_error`): its thought and observation are what was seen of it live.
    None for a step that ran to its end."""


class TrajectoryOut(WireModel):
    """A task's recorded steps, also while it runs."""

    task_id: str
    """The task."""
    steps: list[StepOut]
    """Every recorded step, by attempt then index."""


class EventOut(WireModel):
    """One event of a task's live stream (SSE or WebSocket)."""

    seq: int | None
    """From 1 per task, no gaps, for durable events; null for a live-only one (`llm.delta`,
    `tool.output`, keepalive)."""
    type: str
    """`task.queued`, `task.started`, `step.started`, `step.completed`, `artifact.created`,
    `task.finished`; live-only `llm.delta`, `tool.output`."""
    ts: datetime
    """When it happened."""
    task_id: str
    """The task."""
    data: dict[str, Any]
    """The event's own fields (docs/api.md)."""


class ArtifactOut(WireModel):
    """A file the agent left in the output directory."""

    path: str
    """Relative to the output directory (/testbed/output)."""
    size: int
    """Bytes."""
    content_type: str
    """The media type it is served with."""
    sha256: str
    """Hex digest of its bytes."""


class ArtifactList(WireModel):
    """A task's artifacts."""

    items: list[ArtifactOut]
    """By path."""
    skipped: list[SkippedArtifact] = Field(default_factory=list)
    """Output files that are not in `items`, and why."""


class LLMProfileOut(WireModel):
    """A server-side LLM profile as a tenant sees it: never its URL or key."""

    name: str
    """What a task's `llm.profile` says to use it."""
    kind: Literal["openai", "anthropic"]
    """Wire format."""
    model: str
    """The default model (a task's `llm.model` when it does not say)."""
    models: list[str]
    """Models a task may ask for; empty: any."""
    scripted: bool
    """A fixed script standing in for a model (the `scripted` demo profile)."""
    input_price_per_mtok: float | None = None
    """Price per million prompt tokens, as configured; null: not known."""
    output_price_per_mtok: float | None = None
    """Price per million completion tokens, as configured; null: not known."""


class LLMProfileList(WireModel):
    """The LLM profiles a task may name."""

    profiles: list[LLMProfileOut]
    """Configured profiles, `default` first; the scripted demo last."""
    notice: str | None = None
    """What to set when no real model is configured; null when one is."""


class ErrorBody(WireModel):
    """What went wrong."""

    code: str
    """Stable and machine-readable: `invalid_input`, `not_found`, `unauthorized`,
    `too_large`, `conflict`, ..."""
    message: str
    """In words; for invalid input, the first problem and where it is."""
    details: Any = None
    """More, by code: for `invalid_input` every problem (`loc`, `msg`, `type`); often null."""


class ErrorOut(WireModel):
    """Every error answer of the API (4xx and 5xx)."""

    error: ErrorBody
    """The error."""
