"""The worker's side of tenants' images: build one when the API asks, or when a sandbox of
one starts on a host that lacks it (`app.services.sandboxes.builds` keeps the Dockerfile and
context for that).

At most `SANDHIVE_IMAGE_BUILD_MAX_CONCURRENT` builds run on a worker at once; two asks for
the same content wait for one build. The image's tag is its content's digest, so a host that
has the tag has the image.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from app import metrics
from app.bus import files as bus
from app.db import models
from app.errors import SandboxError
from app.sandbox import image as images
from app.sandbox import tenant_image
from app.services.sandboxes import builds as rows
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)


async def _still_wanted(ctx: WorkerContext, request: dict[str, Any]) -> bool:
    try:
        return not await bus.expired(ctx.redis, request)
    except (RedisError, OSError):
        return True


BUILT_LABEL = "sandhive.built"
"""On a tenant's image: `TENANT/NAME` of the build that made it (for an operator's prune)."""


def base_references(dockerfile: str) -> list[str]:
    """The Docker references the stages of a canonical Dockerfile (`FROM REF [AS name]`, one
    instruction a line) start from, earlier stages left out."""
    stages: set[str] = set()
    found: list[str] = []
    for line in dockerfile.splitlines():
        words = line.split(" ")
        if words[0] != "FROM":
            continue
        if words[1] not in stages:
            found.append(words[1])
        if len(words) == 4:
            stages.add(words[3])
    return found


class Builder:
    """Builds tenants' images on this worker's daemon."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self._turns = asyncio.Semaphore(ctx.settings.image_build_max_concurrent)
        self._same: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """Build what the API asked for and record the outcome in its row."""
        tenant, name = str(request.get("tenant")), str(request.get("name"))
        row = await rows.stored(self.ctx.sessions, tenant, name)
        if row is None or row.digest != request.get("digest"):
            return {"failure": f"image {name!r} was built again or deleted meanwhile"}
        try:
            built = await self._build(row, wanted=lambda: _still_wanted(self.ctx, request))
            if built is None:
                return {"failure": "the caller stopped waiting before the build's turn came"}
        except tenant_image.BuildFailed as failed:
            log.info("image %s/%s did not build: %s", tenant, name, failed.message)
            await rows.record(
                self.ctx.sessions, row, worker=self.ctx.name, log=failed.log, error=failed.message
            )
            return {"failure": failed.message}
        except SandboxError as exc:
            await rows.record(
                self.ctx.sessions, row, worker=self.ctx.name, log="", error=exc.message
            )
            return {"failure": exc.message}
        log.info("built image %s/%s as %s", tenant, name, row.reference)
        config = {"workdir": built.workdir, "user": built.user, "env": built.env}
        await rows.record(
            self.ctx.sessions, row, worker=self.ctx.name, log=built.log, config=config
        )
        return {"built": True}

    async def ensure(self, tenant: str, built: dict[str, str], reference: str) -> None:
        """Make the image of a sandbox about to start present here; SandboxError if it cannot
        be (its row changed or went, or it no longer builds)."""
        host = self.ctx.runner.docker
        if await images.has_image(host, reference):
            return
        row = await rows.stored(self.ctx.sessions, tenant, built["name"])
        if row is None or row.digest != built["digest"]:
            raise SandboxError(
                f"image built/{built['name']} was built again or deleted since; ask again"
            )
        try:
            await self._build(row, unless_present=True)
        except tenant_image.BuildFailed as failed:
            message = f"image built/{row.name} did not build here: {failed.message}"
            raise SandboxError(message) from failed

    async def _build(
        self,
        row: models.ImageBuildRow,
        *,
        unless_present: bool = False,
        wanted: Callable[[], Awaitable[bool]] | None = None,
    ) -> tenant_image.Built | None:
        """Build it (one build of the same content at a time); None when `unless_present`
        and another ask made it meanwhile, or when its asker stopped waiting (`wanted`)
        before its turn came."""
        # One lock per content ever built here (kept: a handful of objects per build, and
        # dropping one while a waiter is about to take it would let two builds run).
        async with self._same[row.digest], self._turns:
            if wanted is not None and not await wanted():
                return None
            if unless_present and await images.has_image(self.ctx.runner.docker, row.reference):
                return None
            return await self._timed(row)

    async def _have_bases(self, row: models.ImageBuildRow) -> None:
        """Every image the canonical Dockerfile's stages start from is here: the daemon
        would pull a missing one (the API chose a worker that has them; its images may
        have gone since)."""
        for reference in base_references(row.dockerfile):
            if not await images.has_image(self.ctx.runner.docker, reference):
                raise tenant_image.BuildFailed(
                    f"worker {self.ctx.name} lacks the catalogue image {reference}"
                    " (nothing is pulled: build it there with sandhive image build)",
                    "",
                )

    async def _timed(self, row: models.ImageBuildRow) -> tenant_image.Built:
        s, started = self.ctx.settings, time.monotonic()
        outcome = "failed"
        try:
            await self._have_bases(row)
            built = await tenant_image.build(
                self.ctx.runner.docker,
                reference=row.reference,
                dockerfile=row.dockerfile,
                context=row.context,
                build_args=dict(row.build_args),
                limits=tenant_image.Limits(
                    memory_mb=s.image_build_memory_mb,
                    cpus=s.image_build_cpus,
                    timeout_s=s.image_build_timeout_s,
                ),
                labels={BUILT_LABEL: f"{row.tenant_id}/{row.name}"},
            )
            outcome = "built"
            return built
        finally:
            metrics.IMAGE_BUILD_SECONDS.labels(outcome).observe(time.monotonic() - started)
