"""Sandhive as an Inspect sandbox: `sandbox="sandhive"` where a task said `sandbox="docker"`.

Installed with `pip install 'sandhive-client[inspect]'`; Inspect finds the provider through
this package's `inspect_ai` entry point, so nothing needs importing. Each sample gets one
sandbox of its own (`POST /v1/sandboxes`, named `default`), deleted when the sample ends;
Inspect writes the sample's `files` into it (`write_file`), runs its tools' commands
(`exec`) and reads files back (`read_file`), each one call of the Sandhive API.

Configure it with `SandhiveSandboxConfig` (`sandbox=("sandhive", SandhiveSandboxConfig(...))`,
or the path of a YAML/JSON file of the same fields); the server and key default to
`SANDHIVE_URL` and `SANDHIVE_API_KEY`. The guide: docs/inspect.md in the Sandhive repository.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import posixpath
import time
from pathlib import Path
from typing import Any, Literal, overload

import yaml
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict, Field

from sandhive_client import errors
from sandhive_client.aio import AsyncSandbox, AsyncSandhive

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3600
"""How long a sandbox outlives its eval if the eval dies without deleting it (the provider
renews it while the sample runs)."""
DEFAULT_CONCURRENCY = 16
"""Sandboxes at once unless `--max-sandboxes` says otherwise: half the server's default
per-tenant cap (`SANDHIVE_TENANT_MAX_SANDBOXES`, 32)."""
CREATED_BY = "inspect"
"""The `created_by` label of every sandbox this provider makes (`inspect sandbox cleanup
sandhive` deletes the running ones)."""


class SandhiveSandboxConfig(BaseModel):
    """Where the Sandhive API is and what sandbox each sample gets.

    Hashable (Inspect keys its sandbox set by it) and written into the eval log without
    `api_key`: a retried eval takes the key from `SANDHIVE_API_KEY` again.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    """The API's address, e.g. `http://127.0.0.1:8000`; None: `SANDHIVE_URL`."""
    api_key: str | None = Field(default=None, exclude=True, repr=False)
    """None: `SANDHIVE_API_KEY`. Never written to the eval log."""
    image: str = "default"
    """A catalogue image by name (`GET /v1/images`); `default` is the server's own."""
    cpus: float | None = None
    """CPU cores; None: the image's default."""
    memory_mb: int | None = None
    disk_mb: int | None = None
    """Size of the workdir (`/testbed`); None: the image's default."""
    network: Literal["none", "egress"] | None = None
    """`none` (the server's default): no network; `egress`: outbound internet through the
    server's filtering proxy, if it allows it."""
    allow_domains: tuple[str, ...] | None = None
    """With `egress`: the names the sandbox may reach, within the server's list."""
    ttl_s: int = Field(default=DEFAULT_TTL_S, ge=60)
    """Seconds a sandbox lives past its last use by the provider (renewed as the sample runs;
    the server's `SANDHIVE_SANDBOX_MAX_LIFETIME_S` caps its whole life)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables every command sees (an `exec`'s own `env` wins)."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """Labels of your own, added to the provider's (`inspect_task`, `inspect_sample`, ...)."""
    read_only_rootfs: bool | None = None
    """None: the server's default, the image's own files read-only (the workdir, /tmp and
    the other scratch directories writable). False lets commands install packages or add
    users, where the operator allows it (`SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS`)."""
    timeout_s: float = Field(default=300.0, gt=0)
    """How long one API call (but a command, which waits as long as its own timeout) may
    take before the provider gives up on it."""

    def __hash__(self) -> int:
        return hash(self.model_dump_json())


@sandboxenv(name="sandhive")
class SandhiveSandboxEnvironment(SandboxEnvironment):
    """One Sandhive sandbox (`sandbox.id`) standing for one sample's `default` environment."""

    def __init__(
        self, client: AsyncSandhive, sandbox: AsyncSandbox, config: SandhiveSandboxConfig
    ) -> None:
        super().__init__()
        self.client = client
        self.sandbox = sandbox
        self._ttl_s = config.ttl_s
        self._renewed = time.monotonic()

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandhiveSandboxConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        return DEFAULT_CONCURRENCY

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Fail before any sample starts when the server cannot be reached or the key is
        refused."""
        settings = config_of(config)
        async with client_of(settings) as client:
            try:
                await client.sandboxes.list(limit=1)
            except (errors.ConnectionFailed, errors.Unauthorized) as exc:
                raise RuntimeError(
                    f"the sandhive sandbox cannot use the Sandhive API at {client_url(settings)}:"
                    f" {exc} (set SANDHIVE_URL and SANDHIVE_API_KEY, or url and api_key in"
                    " SandhiveSandboxConfig)"
                ) from exc

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        settings = config_of(config)
        client = client_of(settings)
        try:
            sandbox = await client.sandboxes.create(
                image=settings.image,
                ttl_s=settings.ttl_s,
                metadata={**labels(task_name, metadata), **settings.metadata},
                env=settings.env,
                cpus=settings.cpus,
                memory_mb=settings.memory_mb,
                disk_mb=settings.disk_mb,
                network=settings.network,
                allow_domains=settings.allow_domains,
                read_only_rootfs=settings.read_only_rootfs,
            )
        except BaseException:
            await client.close()
            raise
        return {"default": cls(client, sandbox, settings)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Delete the sample's sandbox, interrupted or not (nothing is shown from it later); a
        sandbox the server cannot be told about ends at its TTL."""
        for environment in environments.values():
            own = environment.as_type(SandhiveSandboxEnvironment)
            try:
                await own.sandbox.delete()
            except errors.NotFound:
                pass
            except errors.SandhiveError as exc:
                log.warning(
                    "could not delete sandbox %s (it ends at its TTL): %s", own.sandbox.id, exc
                )
            finally:
                await own.client.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup sandhive [ID]`: delete that sandbox, or every running
        sandbox this provider made for the key's tenant."""
        async with client_of(SandhiveSandboxConfig()) as client:
            if id is not None:
                await (await client.sandboxes.get(id)).delete()
                return
            cursor: str | None = None
            while True:
                page = await client.sandboxes.list(status="running", limit=100, cursor=cursor)
                for info in page.items:
                    if info.metadata.get("created_by") == CREATED_BY:
                        await (await client.sandboxes.get(info.id)).delete()
                if page.next_cursor is None:
                    return
                cursor = page.next_cursor

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 (Inspect's signature)
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """`POST …/exec`. The server enforces `timeout` on the whole process tree and keeps at
        most `MAX_EXEC_OUTPUT_SIZE` of each stream; a command that cannot start is exit 126
        with the reason in stderr (a non-executable file is PermissionError)."""
        await self._keep_alive()
        try:
            result = await self.sandbox.exec(
                cmd,
                stdin=input,
                cwd=cwd,
                env=env,
                user=user,
                timeout_s=timeout,
                max_output_bytes=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            )
        except (errors.NotFound, errors.Conflict) as exc:
            raise self._unavailable(exc) from exc
        stdout, stderr = result.stdout_text, result.stderr_text
        if result.timed_out or result.exit_code is None:
            limit = f"{timeout} seconds" if timeout is not None else "the server's limit"
            timed_out = TimeoutError(f"Command timed out after {limit}")
            if stdout or stderr:
                timed_out.truncated_output = stdout + stderr  # type: ignore[attr-defined]
            raise timed_out
        if result.stdout_truncated or result.stderr_truncated:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=stdout + stderr,
            )
        if result.exit_code == 126 and _exec_refused(stderr):
            raise PermissionError(f"Permission denied executing command: {stderr.strip()}")
        return ExecResult(
            success=result.exit_code == 0,
            returncode=result.exit_code,
            stdout=stdout,
            stderr=stderr,
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        await self._keep_alive()
        try:
            await self.sandbox.files.write(file, contents)
        except errors.SandboxIsADirectory as exc:
            raise IsADirectoryError(errno.EISDIR, "Is a directory.", file) from exc
        except errors.SandboxPermissionError as exc:
            raise PermissionError(errno.EACCES, "Permission denied.", file) from exc
        except (errors.NotFound, errors.Conflict) as exc:
            raise self._unavailable(exc) from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """`GET …/files`; over `MAX_READ_FILE_SIZE` (or the server's own limit) is
        OutputLimitExceededError. Text is strict UTF-8, its newlines kept as they are."""
        if posixpath.basename(file.rstrip("/")) in (".", ".."):
            raise IsADirectoryError(errno.EISDIR, "Is a directory.", file)
        await self._keep_alive()
        try:
            contents = await self.sandbox.files.read(file)
        except errors.SandboxFileNotFound as exc:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory.", file) from exc
        except errors.SandboxIsADirectory as exc:
            raise IsADirectoryError(errno.EISDIR, "Is a directory.", file) from exc
        except errors.SandboxPermissionError as exc:
            raise PermissionError(errno.EACCES, "Permission denied.", file) from exc
        except errors.SandboxFileTooLarge as exc:
            raise read_limit_error() from exc
        except (errors.NotFound, errors.Conflict) as exc:
            raise self._unavailable(exc) from exc
        if len(contents) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise read_limit_error()
        return contents.decode("utf-8") if text else contents

    def _unavailable(self, exc: errors.APIError) -> SandboxUnavailableError:
        return SandboxUnavailableError(
            f"The sandbox {self.sandbox.id} is not running and cannot execute: {exc.message}"
        )

    async def _keep_alive(self) -> None:
        """Renew the sandbox's TTL once half of it has passed since the last renewal, so a
        long sample keeps it while a dead eval's sandbox ends within `ttl_s`."""
        if time.monotonic() - self._renewed < self._ttl_s / 2:
            return
        self._renewed = time.monotonic()
        try:
            await self.sandbox.set_ttl(self._ttl_s)
        except errors.InvalidInput as exc:  # its lifetime cap is near: it ends there
            log.info("sandbox %s keeps its expiry: %s", self.sandbox.id, exc.message)


def config_of(config: SandboxEnvironmentConfigType | None) -> SandhiveSandboxConfig:
    """The provider's config: given, read from a YAML or JSON file, or the defaults."""
    if config is None:
        return SandhiveSandboxConfig()
    if isinstance(config, SandhiveSandboxConfig):
        return config
    if isinstance(config, str):
        text = Path(config).read_text(encoding="utf-8")
        data = json.loads(text) if config.endswith(".json") else yaml.safe_load(text)
        return SandhiveSandboxConfig(**(data or {}))
    if isinstance(config, BaseModel):
        return SandhiveSandboxConfig(**config.model_dump())
    raise TypeError(f"the sandhive sandbox takes a SandhiveSandboxConfig, not {config!r}")


def client_url(config: SandhiveSandboxConfig) -> str:
    url = config.url or os.environ.get("SANDHIVE_URL")
    if not url:
        raise RuntimeError(
            "the sandhive sandbox needs the Sandhive API's address: set SANDHIVE_URL "
            "(e.g. http://127.0.0.1:8000) or SandhiveSandboxConfig(url=...)"
        )
    return url


def client_of(config: SandhiveSandboxConfig) -> AsyncSandhive:
    return AsyncSandhive(client_url(config), config.api_key, timeout=config.timeout_s)


def labels(task_name: str, metadata: dict[str, Any]) -> dict[str, str]:
    """The provider's labels of a sample's sandbox: who made it, for which task and sample."""
    found = {"created_by": CREATED_BY, "inspect_task": task_name[:4096]}
    if "__sample_id__" in metadata:  # Inspect's own key in what it passes
        found["inspect_sample"] = str(metadata["__sample_id__"])[:4096]
    try:  # the epoch is only in Inspect's active sample (not public API: best effort)
        from inspect_ai.log._samples import sample_active

        active = sample_active()
        if active is not None:
            found["inspect_epoch"] = str(active.epoch)
    except (ImportError, AttributeError):
        pass
    return found


def read_limit_error() -> OutputLimitExceededError:
    return OutputLimitExceededError(
        limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
        truncated_output=None,  # as docker's: the content may be large, or binary
    )


def _exec_refused(stderr: str) -> bool:
    """The server could not start the command for lack of permission (not the command's own
    "permission denied", which comes without the server's `exec failed:` prefix)."""
    return stderr.startswith("exec failed:") and "permission denied" in stderr.casefold()
