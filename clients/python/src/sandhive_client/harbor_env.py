"""Sandhive as a Harbor environment: `harbor run -e sandhive_client.harbor_env:SandhiveEnvironment`.

Harbor (Terminal-Bench's harness) loads an environment by import path; install this
package into Harbor's own Python (`pip install sandhive-client`; Harbor brings httpx and
pydantic) and point it at a server with `SANDHIVE_URL` and `SANDHIVE_API_KEY` (or
`--ek url=...`). Each trial gets one sandbox (`POST /v1/sandboxes`), deleted when the trial
stops; every command, upload and download is one call of the Sandhive API.

Sandhive builds no images: the task's `environment/Dockerfile` is replayed in a fresh
sandbox of the catalogue image its `FROM` names (`sandhive_client.harbor_dockerfile` says
what is supported). Its `RUN` steps write the image's own files, so the sandbox is made with
`read_only_rootfs: false`, which the operator must allow
(`SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS=true`). The guide: docs/harbor.md in the Sandhive
repository.

Harbor is imported here only: it is not a dependency of the client (it needs Python >= 3.12).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
import logging
import os
import posixpath
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
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

from sandhive_client import errors
from sandhive_client.aio import AsyncSandbox, AsyncSandhive
from sandhive_client.client import DEFAULT_TIMEOUT
from sandhive_client.harbor_dockerfile import (
    Build,
    Copy,
    Dockerfile,
    DockerfileError,
    MakeDir,
    Run,
    parse,
    plan,
)

__all__ = ["SandhiveEnvironment", "SandhiveOptions"]

log = logging.getLogger(__name__)

DEFAULT_IMAGE_REFERENCES: Mapping[str, str] = {"sandhive-sandbox:latest": "default"}
"""`FROM` references known without asking the server: the server's own default image
(`SANDHIVE_SANDBOX_IMAGE`, catalogue name `default`). Used only when `GET /v1/images` does
not list the images' references; `--ek images=...` adds to it."""
TTL_MARGIN_S = 120
"""A command's sandbox must outlive the command's timeout by this much."""
OUTPUT_TAIL_CHARS = 4000
"""How much of a failed build step's output its error shows."""


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
    list references."""
    shell: str = "bash"
    """The shell Harbor's command lines run in (`<shell> -c`), as Harbor's Docker environment
    uses bash."""


class SandhiveEnvironment(BaseEnvironment):  # type: ignore[misc]  # harbor is untyped here
    """One Sandhive sandbox per trial, its image built by replaying the task's Dockerfile."""

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

    def _read_dockerfile(self) -> Dockerfile:
        """The task's Dockerfile, read when the trial starts: what it cannot replay fails that
        trial (not retried, the task's own problem), not Harbor's whole job."""
        dockerfile = Path(self.environment_dir) / "Dockerfile"
        if not dockerfile.exists():  # a prebuilt `docker_image` task
            return Dockerfile(base=self.task_env_config.docker_image, instructions=())
        try:
            return parse(dockerfile.read_text(encoding="utf-8"))
        except DockerfileError as exc:
            raise SandboxBuildFailedError(f"{dockerfile}: {exc}") from None

    # -- life -------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        dockerfile = await asyncio.to_thread(self._read_dockerfile)
        options = self.options
        url = (options.url or os.environ.get("SANDHIVE_URL") or "").rstrip("/")
        key = options.api_key or os.environ.get("SANDHIVE_API_KEY")
        http = httpx.AsyncClient(timeout=DEFAULT_TIMEOUT)
        self._client = AsyncSandhive(url or None, key, http_client=http)
        image = await self._catalogue_image(http, url, key, dockerfile.base)
        self._sandbox = await self._create(image)
        self.logger.info(f"sandbox {self._sandbox.id} of image {image} for {self.session_id}")
        build = await self._plan(dockerfile)
        await self._build(build)
        self._workdir = self.task_env_config.workdir or build.workdir
        self._image_user = build.user
        self._image_env = dict(build.env)
        # Harbor's output directories (/logs/agent, /logs/verifier, …): mounted by its Docker
        # environment, made here; their contents are downloaded when Harbor asks.
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        # a task of a prebuilt `docker_image` without a Dockerfile gets its environment/ files
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        # A sandbox cannot be paused: it is deleted either way (`delete` keeps images in
        # Harbor's Docker environment; Sandhive's images are the catalogue's).
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

    async def _catalogue_image(
        self, http: httpx.AsyncClient, url: str, key: str | None, base: str
    ) -> str:
        """The catalogue name `FROM base` stands for: a name, or a reference the server
        lists (or `images`/`DEFAULT_IMAGE_REFERENCES` know)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = await http.get(f"{url}/v1/images", headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}/v1/images: {response.status_code} {response.text}")
        images: list[dict[str, Any]] = response.json().get("images", [])
        names = [str(image["name"]) for image in images]
        references = {str(i["reference"]): str(i["name"]) for i in images if i.get("reference")}
        known = {**DEFAULT_IMAGE_REFERENCES, **self.options.images, **references}
        if base in names:
            return base
        if known.get(base) in names:
            return known[base]
        offered = sorted({*names, *(r for r, n in known.items() if n in names)})
        raise SandboxBuildFailedError(
            f"FROM {base}: not an image of this Sandhive's catalogue; FROM must name one of: "
            f"{', '.join(offered) or '(none)'} (GET /v1/images; Sandhive builds no images, "
            "it replays the Dockerfile on a catalogue image)"
        )

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
        return sandbox

    async def _plan(self, dockerfile: Dockerfile) -> Build:
        sandbox = self._require()
        shown = await sandbox.exec(["env", "-0"])
        base_env = dict(
            item.split("=", 1)
            for item in shown.stdout.decode("utf-8", errors="replace").split("\0")
            if "=" in item
        )
        try:
            return plan(dockerfile, base_env=base_env, base_workdir=sandbox.info.workdir)
        except DockerfileError as exc:
            raise SandboxBuildFailedError(f"{self.environment_dir}/Dockerfile: {exc}") from None

    async def _build(self, build: Build) -> None:
        deadline = time.monotonic() + self.task_env_config.build_timeout_sec
        for step in build.steps:
            remaining = max(1.0, deadline - time.monotonic())
            if isinstance(step, Run):
                await self._build_run(step, remaining)
            elif isinstance(step, Copy):
                await self._build_copy(step)
            elif isinstance(step, MakeDir):
                await self._checked(["mkdir", "-p", "--", step.path], f"line {step.line}: WORKDIR")

    async def _build_run(self, step: Run, timeout_s: float) -> None:
        sandbox = self._require()
        await self._keep_alive(timeout_s)
        done = await sandbox.exec(
            list(step.argv), cwd=step.cwd, env=step.env, user=step.user, timeout_s=timeout_s
        )
        if done.exit_code != 0:
            what = "timed out" if done.timed_out else f"exited {done.exit_code}"
            raise SandboxBuildFailedError(
                f"{self.environment_dir}/Dockerfile line {step.line}: RUN {list(step.argv)} "
                f"{what}:\n{_tail(done.stdout)}{_tail(done.stderr)}"
            )

    async def _build_copy(self, step: Copy) -> None:
        if not step.into_dir:  # `COPY x .`: an existing directory takes the file, as in Docker
            probe = await self._require().exec(["test", "-d", step.dest])
            if probe.exit_code == 0:
                step = dataclasses.replace(step, into_dir=True)
        try:
            payload, tops = await asyncio.to_thread(copy_archive, Path(self.environment_dir), step)
        except DockerfileError as exc:
            raise SandboxBuildFailedError(f"{self.environment_dir}/Dockerfile: {exc}") from None
        where = step.dest if step.into_dir else posixpath.dirname(step.dest)
        await self._untar(payload, "/", make=where)
        what = f"line {step.line}: {'ADD' if step.extract else 'COPY'}"
        if step.chown and tops:
            await self._checked(["chown", "-R", "--", step.chown, *tops], f"{what} --chown")
        if step.chmod and tops:
            await self._checked(["chmod", "-R", "--", step.chmod, *tops], f"{what} --chmod")

    async def _checked(self, argv: list[str], what: str) -> None:
        done = await self._require().exec(argv)
        if done.exit_code != 0:
            raise SandboxBuildFailedError(
                f"{self.environment_dir}/Dockerfile {what}: {argv} exited {done.exit_code}:\n"
                f"{_tail(done.stdout)}{_tail(done.stderr)}"
            )

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
        await self._untar(payload, posixpath.dirname(target_path) or "/")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        payload = await asyncio.to_thread(_pack_children, Path(source_dir))
        await self._untar(payload, target_dir)

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

    async def _untar(self, payload: bytes, directory: str, *, make: str | None = None) -> None:
        """Unpack a gzipped tar into `directory` (made first, with `make`), as root."""
        script = 'mkdir -p -- "$1" "$2" && exec tar -xzf - --no-same-owner -C "$1"'
        done = await self._require().exec(
            ["sh", "-c", script, "sh", directory, make or directory], stdin=payload
        )
        if done.exit_code != 0:
            raise RuntimeError(
                f"unpacking into {directory} exited {done.exit_code}: "
                f"{done.stderr.decode('utf-8', errors='replace')}"
            )

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


def copy_archive(context: Path, step: Copy) -> tuple[bytes, list[str]]:
    """A gzipped tar of what `step` copies, its members named by their absolute paths in the
    sandbox (without the leading `/`), and the top-level paths it writes."""
    root = context.resolve()
    buffer = io.BytesIO()
    tops: list[str] = []
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for pattern in step.sources:
            matches = sorted(root.glob(pattern)) if _is_glob(pattern) else [root / pattern]
            matches = [m for m in matches if m.exists() or m.is_symlink()]
            if not matches:
                raise DockerfileError(f"line {step.line}: {pattern}: no such file in {context}")
            for match in matches:
                if not match.resolve().is_relative_to(root):
                    raise DockerfileError(f"line {step.line}: {pattern} leads outside {context}")
                tops.extend(_add(archive, match, step))
    return buffer.getvalue(), tops


def _add(archive: tarfile.TarFile, source: Path, step: Copy) -> list[str]:
    if source.is_dir() and not source.is_symlink():
        written = []
        for child in sorted(source.iterdir()):
            target = posixpath.join(step.dest, child.name)
            archive.add(str(child), arcname=target.lstrip("/"), filter=_as_root)
            written.append(target)
        return written
    target = posixpath.join(step.dest, source.name) if step.into_dir else step.dest
    if step.extract and source.is_file() and tarfile.is_tarfile(source):
        directory = step.dest
        with tarfile.open(source) as inner:
            for member in inner.getmembers():
                name = posixpath.normpath(posixpath.join(directory, member.name))
                if not name.startswith(directory.rstrip("/") + "/") and name != directory:
                    raise DockerfileError(f"line {step.line}: {source.name}: {member.name}")
                data = inner.extractfile(member) if member.isfile() else None
                renamed = copy.copy(member)
                renamed.name = name.lstrip("/")
                if member.islnk():
                    renamed.linkname = posixpath.join(directory, member.linkname).lstrip("/")
                archive.addfile(renamed, data)
        return []
    archive.add(str(source), arcname=target.lstrip("/"), filter=_as_root)
    return [target]


def _pack(entries: list[tuple[Path, str]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, name in entries:
            archive.add(str(path), arcname=name, filter=_as_root)
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


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member


def _tail(output: bytes) -> str:
    text = output.decode("utf-8", errors="replace")
    return text[-OUTPUT_TAIL_CHARS:]


def _create_refused(exc: errors.APIError, image: str, network: str) -> str:
    text = f"the Sandhive server refused the sandbox (image {image}, network {network}): {exc}"
    detail = str(exc.details)
    if "read_only_rootfs" in detail:
        text += (
            "; the Dockerfile's steps write the image's files, so the server must allow "
            "writable sandboxes: SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS=true"
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
