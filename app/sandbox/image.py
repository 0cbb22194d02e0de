"""Sandbox images: find the Dockerfile, build it, build an offline base, and ask the daemon
which images it has.

Used by `sandhive image build|list` (cli) and by the worker (which catalogue images its
daemon has, `app.worker.images`). The default image's build context is just the
Dockerfile (it has no COPY), so building is cheap and a repeat build is a layer-cache
hit; a catalogue image may name a context directory of its own.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiodocker.exceptions import DockerError

import app
from app.domain import build_context
from app.domain.image_catalogue import DEFAULT, Image
from app.errors import SandboxError
from app.sandbox.docker import DockerHost, docker_errors

DOCKERFILE_NAME = "Dockerfile.sandbox"
BASE_SCRIPT = Path("deploy") / "build-base-image.sh"
OFFLINE_BASE = "sandhive-base:bookworm"
CONTEXT_DOCKERFILE = build_context.DOCKERFILE


def _repo_root() -> Path:
    return Path(app.__file__).resolve().parent.parent


def find_dockerfile() -> Path:
    """./Dockerfile.sandbox, else the packaged copy, else the one at the repository root."""
    candidates = [
        Path.cwd() / DOCKERFILE_NAME,
        Path(__file__).resolve().parent / DOCKERFILE_NAME,
        _repo_root() / DOCKERFILE_NAME,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise SandboxError(f"{DOCKERFILE_NAME} not found (looked in {', '.join(map(str, candidates))})")


def _context_tar(dockerfile: Path, context: Path | None = None) -> bytes:
    """A gzipped build context: the directory `context` (if any), then the Dockerfile."""
    content = dockerfile.read_bytes()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        if context is not None:
            if not context.is_dir():
                raise SandboxError(f"build context {context} is not a directory")
            tar.add(context, arcname=".", filter=_no_owner)
        info = tarfile.TarInfo(CONTEXT_DOCKERFILE)
        info.size, info.mode = len(content), 0o644
        tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue())


def _no_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


async def build_sandbox_image(
    host: DockerHost,
    *,
    tag: str,
    dockerfile: Path,
    base_image: str | None,
    on_log: Callable[[str], None] | None = None,
    context: Path | None = None,
) -> None:
    """Build a sandbox image (`BASE_IMAGE` build argument: `base_image`); SandboxError (with
    Docker's message) if any step fails."""
    tarball = _context_tar(dockerfile, context)
    buildargs = {"BASE_IMAGE": base_image} if base_image else None
    with docker_errors(f"build {tag}"):
        chunks = host.api().images.build(
            fileobj=io.BytesIO(tarball),
            encoding="gzip",
            path_dockerfile=CONTEXT_DOCKERFILE,
            tag=tag,
            buildargs=buildargs,
            forcerm=True,
            stream=True,
        )
        async for chunk in chunks:
            _report(chunk, on_log)


def _report(chunk: dict[str, object], on_log: Callable[[str], None] | None) -> None:
    if "error" in chunk:
        raise SandboxError(f"image build failed: {chunk['error']}")
    text = chunk.get("stream")
    if on_log is not None and isinstance(text, str):
        for line in text.splitlines():
            if line.strip():
                on_log(line)


async def pull_image(host: DockerHost, reference: str) -> None:
    """Pull an image from its registry (a catalogue image given only by reference)."""
    with docker_errors(f"pull {reference}"):
        await host.api().images.pull(reference)


async def has_image(host: DockerHost, reference: str) -> bool:
    """Whether the daemon has this image now; SandboxError when it cannot say."""
    try:
        await host.api().images.inspect(reference)
    except DockerError as exc:
        if exc.status == 404:
            return False
        raise SandboxError(f"inspect image {reference}: {exc.message}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise SandboxError(f"inspect image {reference}: {exc!r}") from exc
    return True


def find_base_script() -> Path:
    """deploy/build-base-image.sh, from the working directory or the repository root."""
    for root in (Path.cwd(), _repo_root()):
        if (root / BASE_SCRIPT).is_file():
            return root / BASE_SCRIPT
    raise SandboxError(f"{BASE_SCRIPT} not found in {Path.cwd()} or {_repo_root()}")


def build_offline_base(tag: str = OFFLINE_BASE, *, force: bool = False) -> None:
    """Debootstrap a Debian base with no registry (blocking, ~1 min; a no-op if tag exists)."""
    script = find_base_script()
    env = {**os.environ, "FORCE": "1" if force else "0"}
    done = subprocess.run(
        ["bash", str(script), tag], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-4000:]
        raise SandboxError(f"building the base image {tag} failed: {detail}")


async def build_catalogue_image(
    host: DockerHost,
    image: Image,
    *,
    base_image: str | None,
    on_log: Callable[[str], None] | None = None,
) -> str:
    """Make one catalogue image present on this daemon; what was done, in words.

    The Dockerfile (Dockerfile.sandbox for `default`) gets `base_image` as `ARG
    BASE_IMAGE`: for `default` a Debian base (None: the Dockerfile's own), for the
    others the default image, so they have everything a sandbox needs. An image
    given only by reference is pulled.
    """
    if image.name == DEFAULT:
        dockerfile: Path | None = find_dockerfile()
    else:
        dockerfile = image.dockerfile
    if dockerfile is None:
        await pull_image(host, image.reference)
        return f"pulled {image.reference}"
    if not dockerfile.is_file():
        raise SandboxError(f"image {image.name!r}: Dockerfile {dockerfile} not found")
    await build_sandbox_image(
        host,
        tag=image.reference,
        dockerfile=dockerfile,
        base_image=base_image,
        on_log=on_log,
        context=image.context,
    )
    return f"built {image.reference}"
