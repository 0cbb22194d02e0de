"""The Harbor environment's replay of a task's Dockerfile in a running sandbox.

No image is built: the trial's sandbox is a catalogue image (the one `FROM` names) and the
file's `RUN`, `COPY`/`ADD` and `WORKDIR` steps run in it, each one call of the API (so each
shows in the sandbox's command log). What `sandhive_client.harbor_env` does when the server
does not build images (`SANDHIVE_IMAGE_BUILDS` off) or `--ek build=replay` asks for it;
`sandhive_client.harbor_dockerfile` reads the file and says what is supported.

Harbor is imported here only for its error class; it needs Python >= 3.12.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
import posixpath
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from harbor.environments.base import SandboxBuildFailedError

from sandhive_client._build import as_root
from sandhive_client.aio import AsyncSandbox, AsyncSandhive
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

DEFAULT_IMAGE_REFERENCES: Mapping[str, str] = {"sandhive-sandbox:latest": "default"}
"""`FROM` references known without asking the server: the server's own default image
(`SANDHIVE_SANDBOX_IMAGE`, catalogue name `default`). Used only when `GET /v1/images` does
not list the images' references; `--ek images=...` adds to it."""
OUTPUT_TAIL_CHARS = 4000
"""How much of a failed build step's output its error shows."""


def read_dockerfile(directory: Path, docker_image: str | None) -> Dockerfile:
    """The task's Dockerfile, read when the trial starts: what it cannot replay fails that
    trial (not retried, the task's own problem), not Harbor's whole job."""
    dockerfile = directory / "Dockerfile"
    if not dockerfile.exists():  # a prebuilt `docker_image` task
        return Dockerfile(base=docker_image or "", instructions=())
    try:
        return parse(dockerfile.read_text(encoding="utf-8"))
    except DockerfileError as exc:
        raise SandboxBuildFailedError(f"{dockerfile}: {exc}") from None


async def catalogue_image(
    client: AsyncSandhive, base: str, references: Mapping[str, str] | None = None
) -> str:
    """The catalogue name `FROM base` stands for: a name, or a reference the server lists
    (or `references`/`DEFAULT_IMAGE_REFERENCES` know)."""
    images = await client.images.list()
    names = [image.name for image in images]
    listed = {image.reference: image.name for image in images if image.reference}
    known = {**DEFAULT_IMAGE_REFERENCES, **(references or {}), **listed}
    if base in names:
        return base
    if known.get(base) in names:
        return known[base]
    offered = sorted({*names, *(r for r, n in known.items() if n in names)})
    raise SandboxBuildFailedError(
        f"FROM {base}: not an image of this Sandhive's catalogue; FROM must name one of: "
        f"{', '.join(offered) or '(none)'} (GET /v1/images; the Dockerfile is replayed on "
        "a catalogue image)"
    )


class Replay:
    """The steps of one Dockerfile, run in `sandbox` with `context` as the build context;
    `keep_alive(timeout_s)` extends the sandbox's TTL before a step that may run that long."""

    def __init__(
        self,
        sandbox: AsyncSandbox,
        context: Path,
        keep_alive: Callable[[float], Awaitable[None]],
    ) -> None:
        self._sandbox = sandbox
        self._context = context
        self._keep_alive = keep_alive

    async def plan(self, dockerfile: Dockerfile) -> Build:
        """The steps, with the variables and workdir of the running base image."""
        shown = await self._sandbox.exec(["env", "-0"])
        base_env = dict(
            item.split("=", 1)
            for item in shown.stdout.decode("utf-8", errors="replace").split("\0")
            if "=" in item
        )
        try:
            return plan(dockerfile, base_env=base_env, base_workdir=self._sandbox.info.workdir)
        except DockerfileError as exc:
            raise SandboxBuildFailedError(f"{self._context}/Dockerfile: {exc}") from None

    async def run(self, build: Build, timeout_s: float) -> None:
        """Every step, within `timeout_s` in all; the first that fails fails the trial."""
        deadline = time.monotonic() + timeout_s
        for step in build.steps:
            remaining = max(1.0, deadline - time.monotonic())
            if isinstance(step, Run):
                await self._run(step, remaining)
            elif isinstance(step, Copy):
                await self._copy(step)
            elif isinstance(step, MakeDir):
                await self._checked(["mkdir", "-p", "--", step.path], f"line {step.line}: WORKDIR")

    async def _run(self, step: Run, timeout_s: float) -> None:
        await self._keep_alive(timeout_s)
        done = await self._sandbox.exec(
            list(step.argv), cwd=step.cwd, env=step.env, user=step.user, timeout_s=timeout_s
        )
        if done.exit_code != 0:
            what = "timed out" if done.timed_out else f"exited {done.exit_code}"
            raise SandboxBuildFailedError(
                f"{self._context}/Dockerfile line {step.line}: RUN {list(step.argv)} "
                f"{what}:\n{tail(done.stdout)}{tail(done.stderr)}"
            )

    async def _copy(self, step: Copy) -> None:
        if not step.into_dir:  # `COPY x .`: an existing directory takes the file, as in Docker
            probe = await self._sandbox.exec(["test", "-d", step.dest])
            if probe.exit_code == 0:
                step = dataclasses.replace(step, into_dir=True)
        try:
            payload, tops = await asyncio.to_thread(copy_archive, self._context, step)
        except DockerfileError as exc:
            raise SandboxBuildFailedError(f"{self._context}/Dockerfile: {exc}") from None
        where = step.dest if step.into_dir else posixpath.dirname(step.dest)
        await untar(self._sandbox, payload, "/", make=where)
        what = f"line {step.line}: {'ADD' if step.extract else 'COPY'}"
        if step.chown and tops:
            await self._checked(["chown", "-R", "--", step.chown, *tops], f"{what} --chown")
        if step.chmod and tops:
            await self._checked(["chmod", "-R", "--", step.chmod, *tops], f"{what} --chmod")

    async def _checked(self, argv: list[str], what: str) -> None:
        done = await self._sandbox.exec(argv)
        if done.exit_code != 0:
            raise SandboxBuildFailedError(
                f"{self._context}/Dockerfile {what}: {argv} exited {done.exit_code}:\n"
                f"{tail(done.stdout)}{tail(done.stderr)}"
            )


async def untar(
    sandbox: AsyncSandbox, payload: bytes, directory: str, *, make: str | None = None
) -> None:
    """Unpack a gzipped tar into `directory` (made first, with `make`), as root."""
    script = 'mkdir -p -- "$1" "$2" && exec tar -xzf - --no-same-owner -C "$1"'
    done = await sandbox.exec(
        ["sh", "-c", script, "sh", directory, make or directory], stdin=payload
    )
    if done.exit_code != 0:
        raise RuntimeError(
            f"unpacking into {directory} exited {done.exit_code}: "
            f"{done.stderr.decode('utf-8', errors='replace')}"
        )


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
            archive.add(str(child), arcname=target.lstrip("/"), filter=as_root)
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
    archive.add(str(source), arcname=target.lstrip("/"), filter=as_root)
    return [target]


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def tail(output: bytes | str, chars: int = OUTPUT_TAIL_CHARS) -> str:
    """The end of a step's output, as text."""
    text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else output
    return text[-chars:]
