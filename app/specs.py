"""The resolved task: every default filled in, every maximum checked; what Postgres stores.

The worker reads it, `sandhive run` builds one the same way (`app.domain.resolve`), and
the API shows parts of it. Not the wire contract (`app.schemas.tasks`): it changes with
releases, and rows outlive releases, so two rules keep old and new processes
reading each other's rows during a rolling upgrade:

- Unknown keys are ignored on read, so a row written by a newer release still
  parses. An option whose *value* this release cannot run (a new Literal) still
  fails to parse, and that task fails instead of running without it.
- A row carries only what differs from a default (`stored`), and a field added
  after the first release gets the default that means what older rows meant, so
  a task that uses no new option looks exactly like one the previous release wrote.
  A default here, once released, never changes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Stored(BaseModel):
    # the docstrings under fields describe them in /openapi.json (tasks show these specs)
    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)


class LLMSpec(_Stored):
    """The task's LLM options, resolved."""

    profile: str
    """The LLM profile."""
    model: str
    """The model (the profile's default when the task named none)."""
    temperature: float
    """Sampling temperature."""
    max_tokens_per_call: int
    """`max_tokens` of each model call."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra fields of each request to the model."""
    base_url: str | None = None
    """The rollout's own model server (an allowed one); None: the profile's."""
    capture: bool = False
    """Token ids, log-probabilities and request messages stored per step (RL export)."""
    tokens: Literal["chat", "continuous"] = "chat"
    """`continuous`: the rollout's token sequence kept and continued (app.llm.token_continuous)."""


class LimitsSpec(_Stored):
    """The task's limits, resolved."""

    max_steps: int
    """Model turns before the task ends with `max_steps`."""
    timeout_s: int
    """Wall-clock seconds for the whole task."""
    command_timeout_s: int
    """Seconds one tool command may run."""
    max_context_tokens: int
    """Conversation budget in tokens (then `context_limit`)."""


class BuiltImage(_Stored):
    """Which of the tenant's builds a sandbox runs: enough for any worker to build it."""

    name: str
    """The build's name (`built/NAME` without the prefix)."""
    base: str
    """The catalogue image it was built from."""
    digest: str
    """Its content digest: a rebuild with other content is another image."""


class SandboxSpec(_Stored):
    """The task's sandbox, resolved."""

    image: str
    """The Docker image the sandbox runs (its catalogue image's reference at submit time)."""
    image_name: str = "default"
    """The catalogue image (the submission's `sandbox.image`): the queue it waits on and the
    reference a worker runs. Tasks stored before the catalogue existed ran `default`."""
    network: Literal["none", "egress"]
    """`none` or `egress`."""
    cpus: float
    """CPU cores."""
    memory_mb: int
    """Memory in MiB."""
    disk_mb: int = 1024
    """Tasks stored before the field existed ran with 1024."""
    allow_domains: list[str] = Field(default_factory=list)
    """Egress by name: what the proxy lets the sandbox reach (empty: none, or not proxied)."""
    read_only_rootfs: bool = True
    """False: the image's own files writable too (where the operator allows it)."""
    built: BuiltImage | None = None
    """A tenant's own image (`built/NAME`): `image` is its tag, `image_name` its base (the
    queue and the caps), and a worker lacking the tag builds it from the stored build."""
    snapshots: Literal["off", "steps"] = "off"
    """`steps`: its writable files stored after every step (a fork's `rebuild: snapshot`)."""


class ToolsSpec(_Stored):
    """The task's tool options, resolved."""

    profile: Literal["standard", "reference"]
    """`standard` or `reference` (the paper's package's observations)."""
    answer_all_tool_calls: bool
    """Reply "not run" to every tool call after the first of a turn."""
    shell: Literal["fresh", "persistent"] = "fresh"
    """execute_bash: a fresh shell per call, or one kept for the task."""

    @model_validator(mode="before")
    @classmethod
    def _policy_of_older_rows(cls, data: Any) -> Any:
        """Rows stored before the multi-call option existed follow their profile's default."""
        if isinstance(data, dict) and data.get("answer_all_tool_calls") is None:
            profile = data.get("profile", "standard")
            return {**data, "profile": profile, "answer_all_tool_calls": profile != "reference"}
        return data


class PromptSpec(_Stored):
    """A prompt config resolved at submit time: templates and sandbox directories."""

    name: str
    system: str
    instance: str
    working_dir: str
    input_dir: str
    output_dir: str


class WebhookSpec(_Stored):
    """A task's or an experiment's own webhook, as stored and shown (never a secret)."""

    url: str
    """Where its events are POSTed."""
    events: list[str]
    """The event types sent there."""
    signed_by: str | None = None
    """The subscription (`wh_...`) whose current secret signs them: the tenant's newest
    when it was submitted. Null only where nothing is delivered (`sandhive run`)."""


class VerifierSpec(_Stored):
    """A check run in the task's sandbox after the agent ends; what it writes is the reward."""

    files: list[tuple[str, str]]
    """(path under /tests, base64 bytes) put there once the agent has ended."""
    command: str
    """Run by `bash -c` as root in /tests."""
    timeout_s: int
    """How long the command may run; the sandbox lives that much longer for it."""


class ForkSpec(_Stored):
    """Where a forked task starts (`POST /v1/tasks/{id}/fork`): the parent's recorded steps
    before `step`, played again in a fresh sandbox (`app.runner.replay`), then its model."""

    task_id: str
    """The parent task."""
    attempt: int
    """The parent's attempt whose steps are replayed (its latest when forked)."""
    step: int
    """The steps replayed: the child's model is first asked for step `step`."""
    allow_divergence: bool = False
    """Go on when a replayed tool answers otherwise than recorded (`diverged` says where);
    by default the fork stops there, `replay_diverged`."""
    rebuild: Literal["replay", "snapshot"] = "replay"
    """`snapshot`: the parent's files after step `step - 1` in place of a replay."""


class TaskSpec(_Stored):
    llm: LLMSpec
    limits: LimitsSpec
    sandbox: SandboxSpec
    tools: ToolsSpec
    prompt_config: str
    prompt: PromptSpec | None = None
    """None only in tasks stored before prompt configs were resolved at submit time."""
    mode: Literal["sandbox", "vanilla"] = "sandbox"
    """`vanilla`: one model call, no tools and no sandbox (the paper's baseline).
    Tasks stored before the field existed ran in a sandbox."""
    webhook: WebhookSpec | None = None
    """The task's own webhook; tasks stored before the field existed had none."""
    verifier: VerifierSpec | None = None
    """Run after the agent (Harbor's `tests/test.sh`); tasks stored before had none."""
    fork: ForkSpec | None = None
    """A fork of another task's step; None for every other task."""


def stored(spec: TaskSpec) -> dict[str, Any]:
    """The row's JSON: only what differs from a default (the rolling-upgrade rule above)."""
    return spec.model_dump(mode="json", exclude_defaults=True)


def read_spec(row: dict[str, Any]) -> TaskSpec:
    """A stored spec, whichever release wrote it."""
    return TaskSpec.model_validate(row)
