"""`/v1/sandboxes`: sandboxes a caller drives itself (docs/sandboxes.md).

A caller with its own agent or harness (Inspect, Harbor, a script) gets what a task's agent
gets (a hardened container from the image catalogue, with its limits and egress policy),
runs commands and moves files; no agent loop, no model.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from app.schemas.files import FileEntry, FileList, FileWritten
from app.schemas.tasks import MAX_INT, SandboxRequest, WireModel, _Strict

__all__ = [
    "CommandList",
    "CommandOut",
    "ExecRequest",
    "ExecResult",
    "FileEntry",
    "FileList",
    "FileWritten",
    "SandboxCreate",
    "SandboxList",
    "SandboxOut",
    "TtlRequest",
]

MAX_METADATA_KEYS = 32
MAX_ENV_VARS = 256
Key = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]
Value = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]
NO_NUL = r"^[^\x00]*$"
MAX_ARG_CHARS = 128 * 1024
"""One argument, at most (Linux's MAX_ARG_STRLEN)."""
MAX_ARGV_CHARS = 2 * 1024 * 1024
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class SandboxCreate(SandboxRequest):
    """A sandbox: the image and limits of a task's `sandbox`, how long it lives, and labels."""

    ttl_s: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Seconds it lives unless extended (`POST …/ttl`) or deleted; at most the server's
    `SANDHIVE_SANDBOX_MAX_LIFETIME_S` from its creation (422 beyond). None: 600, or the
    lifetime cap when that is shorter."""
    metadata: dict[Key, Value] = Field(default_factory=dict, max_length=MAX_METADATA_KEYS)
    """Labels of the caller's own (`GET /v1/sandboxes?metadata.<key>=<value>` filters by them)."""
    env: dict[EnvName, Value] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    """Variables every command sees (a command's own `env` wins)."""


class SandboxOut(WireModel):
    id: str = Field(examples=["sbx_01JD8Z6V0Q5W3M9B2C7K4T1R8E"])
    """The sandbox's id."""
    status: Literal["starting", "running", "ended"]
    """`running` from the create's answer on; `ended` once deleted, expired or lost."""
    image: str = Field(examples=["default"])
    """The catalogue image's name."""
    network: Literal["none", "egress"]
    """`none`: no network; `egress`: outbound, never the service's own hosts."""
    cpus: float
    """CPU cores."""
    memory_mb: int
    """Memory in MiB."""
    disk_mb: int
    """Size of the workdir (RAM-backed), in MiB."""
    allow_domains: list[str]
    """With `egress` by name: the names the sandbox may reach."""
    read_only_rootfs: bool
    """Whether the image's own files are read-only."""
    metadata: dict[str, str]
    """The caller's labels."""
    workdir: str = Field(examples=["/testbed"])
    """Where relative paths and commands without `cwd` start."""
    created_at: datetime
    """When it was asked for."""
    expires_at: datetime
    """When it is removed unless extended first."""
    ended_at: datetime | None
    """When it ended; null while it runs."""
    end_reason: Literal["deleted", "expired", "worker_lost", "failed"] | None
    """`deleted` by a caller; `expired` at `expires_at`; `worker_lost`: the worker holding it
    stopped (an infrastructure failure; its container is removed); `failed` to start."""
    error: str | None
    """Why it was lost or could not start."""
    commands: int
    """Commands run in it so far (`GET …/commands` lists them)."""


class SandboxList(WireModel):
    items: list[SandboxOut]
    """One page, newest first."""
    next_cursor: str | None
    """Pass as `cursor` for the next page; null on the last one."""


class TtlRequest(_Strict):
    ttl_s: int = Field(ge=1, le=MAX_INT)
    """Seconds from now; at most what its lifetime cap leaves (422 beyond)."""


class ExecRequest(_Strict):
    """One command: `argv` run as it is, or `command` run by `/bin/sh -c`."""

    # Exactly one of the two, said in the schema as well (fuzzers read it). As `if`/`else`:
    # openapi-python-client cannot parse a model that is a `oneOf` of partial schemas.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"required": ["argv"], "properties": {"argv": {"type": "array"}}},
                    "then": {"properties": {"command": {"type": "null"}}},
                    "else": {
                        "required": ["command"],
                        "properties": {"command": {"type": "string"}},
                    },
                }
            ]
        }
    )

    argv: list[Annotated[str, Field(max_length=MAX_ARG_CHARS, pattern=NO_NUL)]] | None = Field(
        default=None, min_length=1, max_length=65_536, examples=[["ls", "-la"]]
    )
    """The program and its arguments, run as they are (no shell); at most 2 MiB in all,
    as Linux's ARG_MAX."""
    command: str | None = Field(
        default=None, min_length=1, max_length=MAX_ARGV_CHARS, pattern=NO_NUL
    )
    """A shell command line (`sh -c`); exactly one of `argv` and `command`."""
    stdin: str | None = None
    """What the command reads on its standard input (none: it reads EOF at once)."""
    stdin_encoding: Literal["utf-8", "base64"] = "utf-8"
    """`base64` for bytes that are not text."""
    cwd: str | None = Field(default=None, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")
    """Where it runs; relative: below the workdir; none: the workdir."""
    env: dict[EnvName, Value] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    """Variables for this command, over the sandbox's own."""
    user: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]*$"
    )
    """Run as this user of the image (name or uid); none: root, the sandbox's own user."""
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_INT)
    """Kill it and everything it started after this long (`timed_out`); none: the
    server's `SANDHIVE_SANDBOX_EXEC_TIMEOUT_S`, and never past the sandbox's expiry."""
    output_encoding: Literal["utf-8", "base64"] = "utf-8"
    """How `stdout` and `stderr` are given: text (bytes that are not UTF-8 replaced) or
    base64 of the exact bytes."""
    max_output_bytes: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Bytes kept of each stream (the rest dropped, `*_truncated`); none and at most: the
    server's `SANDHIVE_SANDBOX_EXEC_MAX_OUTPUT_BYTES`."""

    @model_validator(mode="after")
    def _one_command(self) -> ExecRequest:
        if (self.argv is None) == (self.command is None):
            raise ValueError("give exactly one of argv and command")
        if self.argv is not None and sum(len(arg) + 1 for arg in self.argv) > MAX_ARGV_CHARS:
            raise ValueError(f"argv is over {MAX_ARGV_CHARS} characters in all (ARG_MAX)")
        if self.stdin is not None and self.stdin_encoding == "utf-8":
            try:
                self.stdin.encode()
            except UnicodeEncodeError:
                raise ValueError("stdin is not text (a lone surrogate): send it base64") from None
        return self


class ExecResult(WireModel):
    command_id: str = Field(examples=["cmd_01JD8Z6V0Q5W3M9B2C7K4T1R8E"])
    """Its entry in the sandbox's command log."""
    exit_code: int | None
    """Its exit status (128+N when signal N killed it; 126 when it could not start, the
    reason in `stderr`); null when it timed out."""
    timed_out: bool
    """It ran past its timeout and was killed with everything it started."""
    stdout: str
    """Its standard output, in `encoding` (the head, when truncated)."""
    stderr: str
    """Its standard error, in `encoding`."""
    encoding: Literal["utf-8", "base64"]
    """The request's `output_encoding`."""
    stdout_truncated: bool
    """More was printed than `max_output_bytes`: the rest was dropped."""
    stderr_truncated: bool
    """As `stdout_truncated`, for stderr."""
    duration_ms: int
    """From its start to its end in the sandbox."""


class CommandOut(WireModel):
    """One entry of a sandbox's command log: who ran what and how it ended."""

    id: str
    """The command's id (`command_id` of its answer)."""
    seq: int
    """1, 2, … in the order the sandbox's commands were sent."""
    argv: list[str] | None
    """As asked: the argv, or null for a shell line."""
    command: str | None
    """As asked: the shell line, or null for an argv."""
    user: str | None
    """The user it ran as; null: root."""
    cwd: str | None
    """The directory asked for; null: the workdir."""
    truncated: bool
    """`argv`/`command` keep only their first 8192 characters here."""
    exit_code: int | None
    """Its exit status; null when it timed out, while it runs, or when its answer never
    came (its caller went away, its worker was lost): `duration_ms` is null then too."""
    timed_out: bool
    """It was killed at its timeout."""
    duration_ms: int | None
    """How long it ran; null until it ends."""
    started_at: datetime
    """When the API sent it."""
    key_id: str | None
    """The API key that ran it."""


class CommandList(WireModel):
    items: list[CommandOut]
    """One page, in the order the commands were sent."""
    next_cursor: str | None
    """Pass as `cursor` for the next page; null on the last one."""
