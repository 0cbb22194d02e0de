"""Build a tenant's own image (`/v1/images/builds`) on this worker's Docker daemon.

The Dockerfile is the canonical one the API wrote (`app.domain.dockerfile_bases`: every
base a catalogue image's Docker reference, nothing to pull, nothing to fetch). The build
runs on Docker's classic builder with no network for `RUN`, each step's container held
to `SANDHIVE_IMAGE_BUILD_MEMORY_MB` and `SANDHIVE_IMAGE_BUILD_CPUS`, and the whole build
to `SANDHIVE_IMAGE_BUILD_TIMEOUT_S`
(leaving stops it: the daemon cancels a build whose client went away, and removes its
containers, `forcerm`). What the steps print is kept, its end, for the caller.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiodocker.exceptions import DockerError

from app.domain import build_context
from app.sandbox.docker import DockerHost, docker_errors

LOG_TAIL_CHARS = 64 * 1024
"""How much of the build's output is kept (its end)."""
CPU_PERIOD_US = 100_000


class BuildFailed(Exception):
    """A step failed, or the build took too long: `message` says which, `log` is its end."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.message = message
        self.log = log


@dataclass(frozen=True)
class Limits:
    """What each build step's container may use, and the whole build's time."""

    memory_mb: int
    cpus: float
    timeout_s: float


@dataclass(frozen=True)
class Built:
    log: str
    workdir: str | None
    user: str | None
    env: dict[str, str]


_COLOURS = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""Terminal escapes Docker wraps a step's stderr in: noise in a JSON answer."""


def _plain(text: str) -> str:
    return _COLOURS.sub("", text)


class _Log:
    def __init__(self) -> None:
        self.text = ""

    def add(self, piece: str) -> None:
        self.text = (self.text + _plain(piece))[-LOG_TAIL_CHARS:]


async def build(
    host: DockerHost,
    *,
    reference: str,
    dockerfile: str,
    context: bytes | None,
    build_args: dict[str, str],
    limits: Limits,
    labels: dict[str, str],
) -> Built:
    """Build and tag `reference`; BuildFailed with Docker's words and the log's end."""
    tarball = await asyncio.to_thread(build_context.with_dockerfile, context, dockerfile)
    memory = limits.memory_mb * 2**20
    params = {
        "t": reference,
        "dockerfile": build_context.DOCKERFILE,
        "version": "1",  # the classic builder: no BuildKit frontends, no RUN --mount
        "networkmode": "none",
        "pull": "0",
        "rm": "1",
        "forcerm": "1",
        "memory": str(memory),
        "memswap": str(memory),  # no swap beyond it
        "cpuperiod": str(CPU_PERIOD_US),
        "cpuquota": str(int(limits.cpus * CPU_PERIOD_US)),
        "buildargs": json.dumps(build_args),
        "labels": json.dumps(labels),
    }
    log = _Log()
    api = host.api()
    try:
        async with asyncio.timeout(limits.timeout_s):
            # aiodocker's `images.build` passes no network mode or limits: its request
            # helper does, with Docker's own parameters.
            async with api._query(
                "build",
                "POST",
                params=params,
                headers={"content-type": "application/x-tar", "Content-Encoding": "gzip"},
                data=tarball,
                timeout=aiohttp.ClientTimeout(),
            ) as response:
                async for line in response.content:
                    _read(line, log)
    except TimeoutError:
        raise BuildFailed(
            f"the build took longer than {limits.timeout_s:g} s (SANDHIVE_IMAGE_BUILD_TIMEOUT_S)",
            log.text,
        ) from None
    except DockerError as exc:
        raise BuildFailed(_plain(str(exc.message)).strip(), log.text) from exc
    with docker_errors(f"inspect {reference}"):
        config = (await api.images.inspect(reference)).get("Config") or {}
    return Built(
        log=log.text,
        workdir=config.get("WorkingDir") or None,
        user=config.get("User") or None,
        env=dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item),
    )


def _read(line: bytes, log: _Log) -> None:
    """One JSON message of Docker's build output: a piece of the log, or the error."""
    if not line.strip():
        return
    try:
        chunk: Any = json.loads(line)
    except ValueError:
        log.add(line.decode(errors="replace"))
        return
    if isinstance(chunk.get("stream"), str):
        log.add(chunk["stream"])
    if "error" in chunk:
        raise BuildFailed(_plain(str(chunk["error"])).strip(), log.text)
