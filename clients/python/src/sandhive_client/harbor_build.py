"""The Harbor environment's server builds: a task's `environment/` folder built by Sandhive
(`client.images.build`) into an image of the tenant's own, which the trial's sandbox runs.

Used by `sandhive_client.harbor_env` (its `build` option) where the operator enabled
`SANDHIVE_IMAGE_BUILDS`. The image is named after the task and a hash of the folder's
content, `harbor-<task>-<12 hex>`: an unchanged folder names an image already built, which
a trial starts from without sending the folder again; a changed one names a new image.
Trials of one Harbor process build one name at a time (the others then find it built).
No Harbor import here: the environment turns `BuildError` into Harbor's own error.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import stat
import time
from pathlib import Path

from sandhive_client import errors
from sandhive_client._build import walk
from sandhive_client.aio import AsyncSandhive
from sandhive_client.models import ImageBuild

PREFIX = "harbor-"
HASH_CHARS = 12
NAME_CHARS = 64
"""A build's name: ^[a-z0-9][a-z0-9_.-]{0,63}$ (the server's `ImageBuildCreate.name`)."""
SERVER_TIMEOUT_S = 900.0
"""The server's default `SANDHIVE_IMAGE_BUILD_TIMEOUT_S`: a build's request may take it."""
ANSWER_SLACK_S = 60.0
"""How much longer than the build the answer may take (the upload, the image's start)."""
LOG_TAIL_CHARS = 4000
"""How much of a failed build's log its error shows."""
DISABLED = "image_builds_disabled"
POLL_S = 2.0
"""How often a trial asks about an image another client is building."""

_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
"""Docker's build output colours a step's stderr."""

_locks: dict[str, asyncio.Lock] = {}


class BuildError(Exception):
    """The task's environment cannot be built: the Dockerfile or a step is at fault."""


class BuildsDisabled(Exception):
    """The server builds no images (403 `image_builds_disabled`)."""


def image_name(environment_name: str, directory: Path) -> str:
    """`harbor-<slug of the task's name>-<12 hex of the folder's content>`, at most 64."""
    room = NAME_CHARS - len(PREFIX) - 1 - HASH_CHARS
    slug = re.sub(r"[^a-z0-9_.-]+", "-", environment_name.lower())[:room].strip("-_.")
    return f"{PREFIX}{slug or 'task'}-{folder_hash(directory)[:HASH_CHARS]}"


def folder_hash(directory: Path) -> str:
    """SHA-256 of the folder's tree: names, kinds, contents, link targets, executable bits
    (not owners or times, which a checkout does not keep)."""
    digest = hashlib.sha256()
    for path, name in walk(directory):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            kind, data = b"l", str(path.readlink()).encode()
        elif stat.S_ISREG(mode):
            kind, data = (b"x" if mode & 0o111 else b"f"), path.read_bytes()
        else:
            kind, data = b"d" if stat.S_ISDIR(mode) else b"o", b""
        encoded = name.encode()
        digest.update(b"%s%d:%s%d:" % (kind, len(encoded), encoded, len(data)))
        digest.update(data)
    return digest.hexdigest()


async def ensure_image(
    client: AsyncSandhive,
    directory: Path,
    name: str,
    *,
    timeout_s: float,
    description: str = "",
) -> ImageBuild:
    """The ready image `name`, built from `directory` (its Dockerfile and context) unless it
    is already. BuildError for the task's faults, BuildsDisabled when the server has builds
    off; any other APIError (a 409 over the tenant's builds, a 503) as it is."""
    async with _locks.setdefault(name, asyncio.Lock()):
        try:
            existing = await _ready(client, name)
            if existing is not None:
                return existing
            return await client.images.build(
                name,
                directory / "Dockerfile",
                context=directory,
                description=description[:1000],
                timeout_s=timeout_s,
            )
        except errors.ImageBuildFailed as exc:
            raise BuildError(failed_message(directory, exc.message, exc.log)) from None
        except errors.InvalidInput as exc:
            raise BuildError(refused_message(directory, exc)) from None
        except errors.TooLarge as exc:
            raise BuildError(
                f"{directory}: too large to send as a build context: {exc.message} "
                "(SANDHIVE_IMAGE_BUILD_MAX_BYTES)"
            ) from None
        except errors.Forbidden as exc:
            if exc.code == DISABLED:
                raise BuildsDisabled(exc.message) from None
            raise
        except errors.Conflict as exc:
            if not _building(exc):
                raise
        # another client builds this very name (another Harbor job, say): wait for it
        return await _wait_built(client, directory, name, timeout_s)


async def _ready(client: AsyncSandhive, name: str) -> ImageBuild | None:
    try:
        found = await client.images.get_build(name)
    except errors.NotFound:
        return None
    return found if found.ready else None


def _building(exc: errors.Conflict) -> bool:
    return isinstance(exc.details, dict) and exc.details.get("status") == "building"


async def _wait_built(
    client: AsyncSandhive, directory: Path, name: str, timeout_s: float
) -> ImageBuild:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await client.images.get_build(name)
        if found.ready:
            return found
        if found.status != "building":
            raise BuildError(failed_message(directory, str(found.error), found.log))
        if time.monotonic() > deadline:
            raise BuildError(f"image {name} is still building after {timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)


def failed_message(directory: Path, message: str, log: str) -> str:
    """The server's words on the failing step, and the end of Docker's output (its colours
    taken out)."""
    text = _COLOURS.sub("", log)[-LOG_TAIL_CHARS:]
    return f"{directory}/Dockerfile: the image build failed: {message}\n{text}"


def refused_message(directory: Path, exc: errors.APIError) -> str:
    """Each located problem of a 422 (`details`), said of the Dockerfile or the folder."""
    problems = exc.details if isinstance(exc.details, list) else []
    said = [
        f"{directory}/Dockerfile: {problem.get('msg')}"
        if (problem.get("loc") or [""])[-1] == "dockerfile"
        else f"{directory}: {(problem.get('loc') or ['?'])[-1]}: {problem.get('msg')}"
        for problem in problems
        if isinstance(problem, dict)
    ]
    return "; ".join(said) or f"{directory}/Dockerfile: {exc.message}"


def request_timeout_s(build_timeout_sec: float) -> float:
    """How long a trial waits for the server's build: the task's `build_timeout_sec` or the
    server's default build timeout, whichever is longer (the server ends the build at its
    own), and the slack."""
    return max(build_timeout_sec, SERVER_TIMEOUT_S) + ANSWER_SLACK_S
