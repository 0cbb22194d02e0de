"""The API's answers as typed objects.

Only the fields a caller commonly reads are declared; every other field the
server sends is kept (`extra="allow"`, read it as an attribute or with
`model_dump()`), so a newer server never breaks an older client.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Usage(_Model):
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Task(_Model):
    """A task: what was asked, where it is (`status`), and what came of it."""

    id: str
    status: str
    finish_reason: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    prompt: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    attempt: int = 0
    answer: str | None = None
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None
    fork: dict[str, Any] | None = None
    """A fork's origin (`parent_id`, `step`, `allow_divergence`, `diverged`); None otherwise."""

    @property
    def done(self) -> bool:
        """True once the task ended (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES


class TaskFork(_Model):
    """A fork's children (`tasks.fork`), queued: each replays `step` steps of `parent_id`."""

    parent_id: str
    step: int
    tasks: list[Task]


class TaskPage(_Model):
    """One page of the task list, newest first; `next_cursor` is None on the last page."""

    items: list[Task]
    next_cursor: str | None = None


class BatchResult(_Model):
    """A batch's tasks in the order sent; `created[i]` is False for an idempotent repeat."""

    tasks: list[Task]
    created: list[bool]


class Step(_Model):
    index: int
    attempt: int
    thought: str | None = None
    action: dict[str, Any] | None = None
    observation: str | None = None
    exit_code: int | None = None


class Trajectory(_Model):
    task_id: str
    steps: list[Step]


class Artifact(_Model):
    path: str
    size: int
    content_type: str
    sha256: str


class ArtifactList(_Model):
    items: list[Artifact]
    skipped: list[dict[str, Any]] = Field(default_factory=list)


class Event(_Model):
    """One event of a task's stream; `seq` counts from 1 without gaps (None: live-only)."""

    seq: int | None
    type: str
    ts: datetime
    task_id: str
    data: dict[str, Any] = Field(default_factory=dict)


class Experiment(_Model):
    id: str
    name: str
    status: str
    created_at: datetime
    finished_at: datetime | None = None
    arms: list[dict[str, Any]] = Field(default_factory=list)
    progress: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ExperimentPage(_Model):
    experiments: list[Experiment]
    next_cursor: str | None = None


class ExperimentItem(_Model):
    row_id: str
    arm: str
    attempt: int
    status: str
    score: float | None = None
    error_kind: str | None = None
    answer: str | None = None
    task_id: str | None = None


class SandboxInfo(_Model):
    """A sandbox as the server describes it (`Sandbox.info`): its image, limits and life."""

    id: str
    status: str
    """`starting`, `running` or `ended`."""
    image: str = "default"
    cpus: float | None = None
    memory_mb: int | None = None
    disk_mb: int | None = None
    network: str = "none"
    allow_domains: list[str] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/testbed"
    """Where relative paths and commands without `cwd` start."""
    created_at: datetime
    expires_at: datetime
    """When the server removes it unless its TTL is extended first (`set_ttl`)."""
    ended_at: datetime | None = None
    end_reason: str | None = None
    """`deleted`, `expired`, `worker_lost` or `failed` once ended."""
    error: str | None = None
    commands: int = 0
    """Commands run in it so far."""

    @property
    def ended(self) -> bool:
        return self.status == "ended"


class SandboxPage(_Model):
    """One page of the sandbox list, newest first; `next_cursor` is None on the last page."""

    items: list[SandboxInfo]
    next_cursor: str | None = None


class ExecResult(_Model):
    """How a command ended and what it printed, as the exact bytes (`stdout_text` decodes)."""

    command_id: str
    exit_code: int | None
    """Its exit status (128+N when signal N killed it; 126 when it could not start, the
    reason in `stderr`); None when it timed out."""
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    """True when the server kept only the first `max_output_bytes` of stdout."""
    stderr_truncated: bool = False
    duration_ms: int = 0

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ExecResult:
        """The API's result, its `stdout`/`stderr` decoded from their `encoding`."""
        fields = {k: v for k, v in data.items() if k not in ("stdout", "stderr", "encoding")}
        return cls(
            **fields,
            stdout=decode_output(data.get("stdout", ""), data.get("encoding")),
            stderr=decode_output(data.get("stderr", ""), data.get("encoding")),
        )

    @property
    def ok(self) -> bool:
        """True when it exited 0."""
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        """stdout as UTF-8 (bytes that are not UTF-8 replaced by U+FFFD)."""
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


class ExecOutput(_Model):
    """One piece of a streamed command's output (`Sandbox.exec_stream`)."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        """`data` as UTF-8 (a character split between two pieces shows as U+FFFD)."""
        return self.data.decode("utf-8", errors="replace")


def decode_output(value: str, encoding: str | None) -> bytes:
    """A stream's bytes from the API's text: base64 when `encoding` says so, else UTF-8."""
    return base64.b64decode(value) if encoding == "base64" else value.encode("utf-8")


class FileEntry(_Model):
    name: str
    type: str
    """`file`, `dir`, `symlink` (not followed) or `other` (fifo, socket, device)."""
    size: int
    mtime: float
    """Seconds since the epoch, by the sandbox's clock."""


class FileList(_Model):
    """A directory of a sandbox, by name."""

    path: str
    """The directory's real path in the sandbox."""
    entries: list[FileEntry]
    truncated: bool = False
    """True when it has more entries than the server lists."""
    unlisted: int = 0
    """Entries left out because their names are not printable UTF-8."""


class FileWritten(_Model):
    path: str
    """Its absolute path in the sandbox."""
    size: int


class Command(_Model):
    """One entry of a sandbox's command log."""

    id: str
    seq: int
    argv: list[str] | None = None
    command: str | None = None
    user: str | None = None
    cwd: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    duration_ms: int = 0
    started_at: datetime
    key_id: str | None = None
    """The API key that ran it."""


class CommandPage(_Model):
    items: list[Command]
    next_cursor: str | None = None


class ImageResources(_Model):
    cpus: float
    memory_mb: int
    disk_mb: int
    """Size of /testbed in MiB (RAM-backed)."""


class Image(_Model):
    """An image this tenant may name in `sandboxes.create(image=...)`: the catalogue's, and
    its own ready builds (`built/NAME`)."""

    name: str
    """What `sandboxes.create` names."""
    reference: str = ""
    """The Docker image its sandboxes run: what a Dockerfile's `FROM` may name."""
    description: str = ""
    defaults: ImageResources | None = None
    """What a sandbox gets when it does not say."""
    max: ImageResources | None = None
    """The most a sandbox may ask for."""
    pids_limit: int | None = None
    available: bool = True
    """Whether a live worker has it now."""


class ImageBuild(_Model):
    """One of the tenant's own images (`images.build`), and how its last build went."""

    name: str
    image: str
    """What `sandboxes.create(image=...)` names: `built/NAME`."""
    status: str
    """`ready` to start sandboxes from; `failed`: `error` and `log` say why; `building`
    while a build of it runs."""
    error: str | None = None
    log: str = ""
    """The end of Docker's build output."""
    digest: str = ""
    """Of the Dockerfile, context and build arguments: building the same again answers
    this image instead of building it anew."""
    base: str = ""
    """The catalogue image its first `FROM` names (its resources and maxima apply)."""
    reference: str = ""
    workdir: str | None = None
    """The image's `WORKDIR` (None: not set). A sandbox's own workdir is /testbed whatever
    the image says: pass this as a command's `cwd` to start where the image would."""
    user: str | None = None
    """The image's `USER` (None: root); pass it as a command's `user`."""
    env: dict[str, str] = Field(default_factory=dict)
    """The image's `ENV`."""
    description: str = ""
    created_at: datetime
    built_at: datetime | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"
