"""The sandbox image: find its Dockerfile, build it, and build an offline base for it.

Used by `sandhive image build` (cli) and by readiness checks. The build
context is just the Dockerfile (it has no COPY), so building is cheap and a
repeat build is a layer-cache hit.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import app
from app.errors import SandboxError
from app.sandbox.docker import DockerHost, docker_errors

DOCKERFILE_NAME = "Dockerfile.sandbox"
BASE_SCRIPT = Path("deploy") / "build-base-image.sh"
OFFLINE_BASE = "sandhive-base:bookworm"


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


def _context_tar(dockerfile: Path) -> bytes:
    """A gzipped build context holding only the Dockerfile."""
    content = dockerfile.read_bytes()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(content), 0o644
        tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue())


async def build_sandbox_image(
    host: DockerHost,
    *,
    tag: str,
    dockerfile: Path,
    base_image: str | None,
    on_log: Callable[[str], None] | None = None,
) -> None:
    """Build the sandbox image; SandboxError (with Docker's message) if any step fails."""
    context = _context_tar(dockerfile)
    buildargs = {"BASE_IMAGE": base_image} if base_image else None
    with docker_errors(f"build {tag}"):
        chunks = host.api().images.build(
            fileobj=io.BytesIO(context),
            encoding="gzip",
            path_dockerfile="Dockerfile",
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
