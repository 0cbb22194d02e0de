"""Sandhive as a Harbor environment: `harbor run -e sandhive_client.harbor_env:SandhiveEnvironment`.

Harbor (Terminal-Bench's harness) loads an environment by import path; install this
package into Harbor's own Python (`pip install sandhive-client`; Harbor brings httpx and
pydantic) and point it at a server with `SANDHIVE_URL` and `SANDHIVE_API_KEY` (or
`--ek url=...`). Each trial gets one sandbox (`POST /v1/sandboxes`), deleted when the trial
stops; every command, upload and download is one call of the Sandhive API.

The task's `environment/` folder is built by the server into an image of the tenant's own
where the operator enabled image builds (`sandhive_client.harbor_build`); otherwise its
Dockerfile is replayed in a fresh sandbox of the catalogue image its `FROM` names
(`sandhive_client.harbor_replay`). The `build` option picks (`auto`, `server`, `replay`).
Harbor writes /logs, /tests and /solution (and a replay the image's own files), so the
sandbox is made with `read_only_rootfs: false`, which the operator must allow
(`SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS=true`). The guide: docs/harbor.md in the Sandhive
repository.

Harbor is imported here only: it is not a dependency of the client (it needs Python >= 3.12).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import posixpath
import tarfile
import time
from pathlib import Path
from typing import Any, Literal

from harbor.environments.base import (
    BaseEnvironment,
    ExecResult,
    SandboxBuildFailedError,
    transfer_tar_filter,
)
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.options import EnvironmentOptions
from harbor.environments.tar_transfer import tar_pack_succeeded
from harbor.models.task.config import NetworkMode
from harbor.models.trial.config import ResourceMode
from pydantic import Field

from sandhive_client import errors, harbor_build
from sandhive_client._build import as_root
from sandhive_client.aio import AsyncSandbox, AsyncSandhive
from sandhive_client.harbor_replay import Replay, catalogue_image, read_dockerfile, untar
from sandhive_client.models import ImageBuild

__all__ = ["SandhiveEnvironment", "SandhiveOptions"]

log = logging.getLogger(__name__)

TTL_MARGIN_S = 120
"""A command's sandbox must outlive the command's timeout by this much."""


class SandhiveOptions(EnvironmentOptions):  # type: ignore[misc]  # harbor is untyped here
    """What `--ek key=value` may set (Harbor parses values as JSON when they are)."""

    url: str | None = None
    """The API's address, e.g. `http://127.0.0.1:8000`; None: `SANDHIVE_URL`."""
    api_key: str | None = Field(default=None, exclude=True, repr=False)
    """None: `SANDHIVE_API_KEY` (better: a key given on the command line lands in the job's
    config.json)."""
    ttl_s: int = Field(default=3600, ge=60)
    """Seconds the sandbox lives past its last command if the run dies without deleting it;
    renewed as commands run, within the server's `SANDHIVE_SANDBOX_MAX_LIFETIME_S`."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """Labels added to each sandbox's own (`harbor_session`, `harbor_task`, `created_by`)."""
    images: dict[str, str] = Field(default_factory=dict)
    """`FROM` reference -> catalogue image name, for servers whose `GET /v1/images` does not
    list references (a replayed Dockerfile's)."""
    build: Literal["auto", "server", "replay"] = "auto"
    """How the task's environment becomes the sandbox: `server` builds it into an image
    (`SANDHIVE_IMAGE_BUILDS` on), `replay` runs its Dockerfile's steps in a sandbox of the
    base image, `auto` builds where the server allows it and replays elsewhere."""
    shell: str = "bash"
    """The shell Harbor's command lines run in (`<shell> -c`), as Harbor's Docker environment
    uses bash."""


class SandhiveEnvironment(BaseEnvironment):  # type: ignore[misc]  # harbor is untyped here
    """One Sandhive sandbox per trial, of the task's image built by the server (or of its
    base image, the Dockerfile replayed in it)."""

    options_model = SandhiveOptions
    options: SandhiveOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: AsyncSandhive | None = None
        self._sandbox: AsyncSandbox | None = None
        self._expires_at = 0.0
        self._workdir: str | None = None
        self._image_user: str | None = None
        self._image_env: dict[str, str] = {}
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "sandhive"

    @property
    def capabilities(self) -> Any:
        # No network at all is `network: none`; allowlists are refused (Harbor checks
        # `network_allowlist` before start); public is the server's `egress`.
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> Any:
        # Sandhive's cpus and memory are hard ceilings (Docker's), fractions allowed.
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        super().preflight(kwargs)
        options = cls.parse_options(kwargs)
        if not (getattr(options, "url", None) or os.environ.get("SANDHIVE_URL")):
            raise SystemExit(
                "the Sandhive environment needs the API's address: set SANDHIVE_URL "
                "(and SANDHIVE_API_KEY), or pass --ek url=http://host:port"
            )

    def _validate_definition(self) -> None:
        directory = Path(self.environment_dir)
        if (directory / "docker-compose.yaml").exists() or (
            directory / "docker-compose.yml"
        ).exists():
            raise ValueError(
                f"{directory}: docker-compose task environments are not supported by the "
                "Sandhive environment (one sandbox per trial)"
            )
        dockerfile = directory / "Dockerfile"
        if not dockerfile.exists() and not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{dockerfile} not found (and the task names no docker_image)")

    # -- life -------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        options = self.options
        url = (options.url or os.environ.get("SANDHIVE_URL") or "").rstrip("/")
        key = options.api_key or os.environ.get("SANDHIVE_API_KEY")
        self._client = AsyncSandhive(url or None, key)
        built = await self._server_image()
        if built is not None:
            self._sandbox = await self._create(built.image)
            self._workdir = self.task_env_config.workdir or built.workdir
            self._image_user = self._run_as(built.user)
            self._image_env = dict(built.env)
        else:
            await self._start_replayed()
        # Harbor's output directories (/logs/agent, /logs/verifier, …): mounted by its Docker
        # environment, made here; their contents are downloaded when Harbor asks.
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        # a task of a prebuilt `docker_image` without a Dockerfile gets its environment/ files
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        # A sandbox cannot be paused: it is deleted either way (`delete` keeps images in
        # Harbor's Docker environment; built images stay for the next trials).
        try:
            if self._sandbox is not None:
                try:
                    await self._sandbox.delete()
                except errors.SandhiveError as exc:
                    self.logger.warning(f"deleting sandbox {self._sandbox.id}: {exc}")
        finally:
            self._sandbox = None
            if self._client is not None:
                await self._client.close()
                self._client = None

    async def _server_image(self) -> ImageBuild | None:
        """The task's image as the server built it; None: replay instead (`build=replay`,
        `auto` on a server without image builds, or a prebuilt `docker_image` task)."""
        directory = Path(self.environment_dir)
        mode = self.options.build
        if mode == "replay" or not (directory / "Dockerfile").exists():
            return None
        assert self._client is not None
        name = await asyncio.to_thread(harbor_build.image_name, self.environment_name, directory)
        try:
            built = await harbor_build.ensure_image(
                self._client,
                directory,
                name,
                timeout_s=harbor_build.request_timeout_s(self.task_env_config.build_timeout_sec),
                description=f"Harbor task {self.environment_name}",
            )
        except harbor_build.BuildError as exc:
            raise SandboxBuildFailedError(str(exc)) from None
        except harbor_build.BuildsDisabled as exc:
            if mode == "server":
                raise RuntimeError(
                    f"--ek build=server, but the Sandhive server builds no images ({exc}): "
                    "its operator must set SANDHIVE_IMAGE_BUILDS=true, or use build=auto"
                ) from None
            self.logger.info(f"the server builds no images ({exc}); replaying the Dockerfile")
            return None
        return built

    async def _start_replayed(self) -> None:
        """A sandbox of the catalogue image `FROM` names, the Dockerfile's steps run in it."""
        assert self._client is not None
        directory = Path(self.environment_dir)
        docker_image = self.task_env_config.docker_image
        dockerfile = await asyncio.to_thread(read_dockerfile, directory, docker_image)
        image = await catalogue_image(self._client, dockerfile.base, self.options.images)
        self._sandbox = await self._create(image)
        replay = Replay(self._sandbox, directory, self._keep_alive)
        build = await replay.plan(dockerfile)
        await replay.run(build, self.task_env_config.build_timeout_sec)
        self._workdir = self.task_env_config.workdir or build.workdir
        self._image_user = build.user
        self._image_env = dict(build.env)

    def _run_as(self, user: str | None) -> str | None:
        """An image's `USER` as a command's user (None: root); a `:group` is dropped (a
        command runs as a user with that user's own groups)."""
        if not user:
            return None
        name = user.split(":", 1)[0]
        if name != user:
            self.logger.warning(f"USER {user}: commands run as {name or 'root'}, its own groups")
        return None if name in ("", "root", "0") else name

    async def _create(self, image: str) -> AsyncSandbox:
        assert self._client is not None
        mode = self._network_policy.network_mode
        network = "none" if mode == NetworkMode.NO_NETWORK else "egress"
        metadata = {
            "created_by": "harbor",
            "harbor_session": self.session_id[:4096],
            "harbor_task": self.environment_name[:4096],
            **self.options.metadata,
        }
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory_mb = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        try:
            sandbox = await self._client.sandboxes.create(
                image,
                ttl_s=self.options.ttl_s,
                metadata=metadata,
                cpus=float(cpus) if cpus is not None else None,
                memory_mb=memory_mb,
                disk_mb=self._effective_storage_mb,
                network=network,
                read_only_rootfs=False,
            )
        except errors.InvalidInput as exc:
            raise RuntimeError(_create_refused(exc, image, network)) from exc
        self._expires_at = time.monotonic() + self.options.ttl_s
        self.logger.info(f"sandbox {sandbox.id} of image {image} for {self.session_id}")
        return sandbox

    # -- commands ---------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        sandbox = self._require()
        resolved = self._resolve_user(user)
        run_as = str(resolved) if resolved is not None else self._image_user
        merged = {**self._image_env, **(self._merge_env(env) or {})}
        await self._keep_alive(timeout_sec)
        done = await sandbox.exec(
            [self.options.shell, "-c", command],
            cwd=cwd or self._workdir,
            env=merged,
            user=None if run_as in ("root", "0") else run_as,
            timeout_s=timeout_sec,
        )
        if done.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        stdout = done.stdout.decode("utf-8", errors="replace")
        stderr = done.stderr.decode("utf-8", errors="replace")
        if done.stdout_truncated or done.stderr_truncated:
            self.logger.warning(f"command {done.command_id}: output truncated by the server")
        emit = self._output_callback()
        if emit is not None:
            if stdout:
                await emit(stdout, "stdout")
            if stderr:
                await emit(stderr, "stderr")
        return ExecResult(stdout=stdout, stderr=stderr, return_code=done.exit_code)

    # -- files ------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        name = posixpath.basename(target_path)
        payload = await asyncio.to_thread(_pack, [(Path(source_path), name)])
        await untar(self._require(), payload, posixpath.dirname(target_path) or "/")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        payload = await asyncio.to_thread(_pack_children, Path(source_dir))
        await untar(self._require(), payload, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self._require().files.read(source_path)
        await asyncio.to_thread(_write, Path(target_path), data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        done = await self._require().exec(["tar", "-czf", "-", "-C", source_dir, "."])
        stderr = done.stderr.decode("utf-8", errors="replace")
        if not tar_pack_succeeded(done.exit_code, stderr=stderr, logger=self.logger):
            raise RuntimeError(f"packing {source_dir} exited {done.exit_code}: {stderr}")
        if done.stdout_truncated:
            raise RuntimeError(
                f"{source_dir} is larger, compressed, than the server's "
                "SANDHIVE_SANDBOX_EXEC_MAX_OUTPUT_BYTES"
            )
        await asyncio.to_thread(_extract, done.stdout, Path(target_dir))

    # -- helpers ----------------------------------------------------------------------

    def _require(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the Sandhive environment is not started")
        return self._sandbox

    async def _keep_alive(self, timeout_s: float | None) -> None:
        """Extend the sandbox's TTL when a command could outlive it (or half of it is gone)."""
        need = (timeout_s or 0) + TTL_MARGIN_S
        remaining = self._expires_at - time.monotonic()
        if remaining >= max(need, self.options.ttl_s / 2):
            return
        ttl = max(self.options.ttl_s, int(need))
        try:
            await self._require().set_ttl(ttl)
            self._expires_at = time.monotonic() + ttl
        except errors.InvalidInput as exc:  # its lifetime cap: commands end at it
            self.logger.warning(f"sandbox TTL not extended: {exc}")


def _pack(entries: list[tuple[Path, str]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, name in entries:
            archive.add(str(path), arcname=name, filter=as_root)
    return buffer.getvalue()


def _pack_children(directory: Path) -> bytes:
    return _pack([(child, child.name) for child in sorted(directory.iterdir())])


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _extract(payload: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as archive:
        archive.extractall(target, filter=transfer_tar_filter)


def _create_refused(exc: errors.APIError, image: str, network: str) -> str:
    text = f"the Sandhive server refused the sandbox (image {image}, network {network}): {exc}"
    detail = str(exc.details)
    if "read_only_rootfs" in detail:
        text += (
            "; Harbor writes /logs, /tests and /solution (and a replayed Dockerfile the "
            "image's own files), so the server must allow writable sandboxes: "
            "SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS=true"
        )
    if network == "egress" and "network" in detail:
        text += (
            "; the task's network_mode is public, which Sandhive gives as `egress`: the "
            "server must enable it, or the task set network_mode = 'no-network'"
        )
    text += (
        "; resources beyond the image's maxima can be lowered with --override-cpus, "
        "--override-memory-mb, --override-storage-mb"
    )
    return text
