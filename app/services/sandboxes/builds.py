"""A tenant's own images (`/v1/images/builds`): a Dockerfile built into `built/NAME`.

Checked here first (`app.domain.dockerfile_bases`: every base a catalogue image the tenant
may use; `app.domain.build_context`: a tar of files), then stored (the context too: any
worker lacking the image builds it again from the row, when a sandbox of it starts there),
then built by the least busy live worker that has the base, over the sandbox servers' lists.
The row holds the outcome: `ready`, or `failed` with Docker's words and the log's end.

The image's tag is its content's digest (Dockerfile, context, arguments, base), so two
builds of the same content share it and a rebuilt name never changes what a running sandbox
runs. Only sandboxes (`POST /v1/sandboxes`) start from these images; tasks and episodes name
catalogue images only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from redis.asyncio import Redis
from sqlalchemy import delete, func, select

from app.bus import files as bus
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain import build_context, dockerfile_bases
from app.domain.image_catalogue import DEFAULT, Image, for_tenant
from app.errors import (
    BuildFailed,
    Conflict,
    ImageBuildsDisabled,
    InvalidInput,
    NotFound,
    Unavailable,
)
from app.ids import utc_now
from app.schemas.images import BUILT_PREFIX, ImageBuildCreate, ImageBuildList, ImageBuildOut
from app.services.images import own
from app.services.sandboxes import placement
from app.services.sandboxes.service import RETRY_S

REPOSITORY = "sandhive-built"
"""The Docker repository of tenants' images; the tag is the content's digest."""
KIND = "sandboxes"
"""Builds go to the workers' sandbox servers (`app.worker.sandboxes`)."""
REPLY_GRACE_S = 30.0
"""How much longer than the build's own limit the API waits for the worker's answer."""


async def build(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: ImageBuildCreate
) -> tuple[ImageBuildOut, bool]:
    """The image built (True) or found already built from the same content (False)."""
    if not settings.image_builds:
        raise ImageBuildsDisabled(
            "this server does not build tenants' images (SANDHIVE_IMAGE_BUILDS); use a"
            " catalogue image (GET /v1/images)"
        )
    row, bases = await _checked_row(settings, tenant, body)
    workers = await placement.candidates(sessions, redis, *bases)
    if not workers:
        raise Unavailable(
            f"no live worker has every image {', '.join(sorted(bases))} to build on (start"
            " one: sandhive worker, with SANDHIVE_SANDBOX_SLOTS above 0)",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    found = await _store(sessions, settings, row)
    if found is not None:
        return out(found), False
    request = {"op": "build", "tenant": tenant, "name": row.name, "digest": row.digest}
    wait_s = settings.image_build_timeout_s + REPLY_GRACE_S
    sent = await bus.send(redis, workers[0], request, timeout_s=wait_s, kind=KIND)
    reply = await bus.wait_reply(
        redis, sent.reply, timeout_s=wait_s, alive=placement.worker_alive(redis, workers[0])
    )
    if reply is None:
        await bus.abandon(redis, sent)
        await _fail(sessions, row, f"infrastructure: worker {workers[0]} did not build it")
        raise Unavailable(
            f"worker {workers[0]} did not build {row.name!r} (it stopped or is slow); ask again",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    done = await _find(sessions, tenant, row.name)
    if done.status == "ready" and done.digest == row.digest:
        return out(done), True
    message = str(reply.get("failure") or done.error or "the build failed")
    if done.status == "building":  # the worker failed before it could say so in the row
        await _fail(sessions, row, message)
        done = await _find(sessions, tenant, row.name)
    raise BuildFailed(
        f"image {row.name!r} did not build: {message}",
        details={"name": row.name, "log": done.log if done.digest == row.digest else ""},
    )


async def _checked_row(
    settings: Settings, tenant: str, body: ImageBuildCreate
) -> tuple[models.ImageBuildRow, frozenset[str]]:
    """The row a request makes, every part checked (422 naming it), not stored yet; and
    the catalogue images its stages stand on."""
    context: bytes | None = None
    context_digest = hashlib.sha256(b"").hexdigest()
    if body.context is not None:
        try:
            context = base64.b64decode(body.context, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("context", "not base64") from None
        cap = settings.image_build_max_bytes * build_context.UNPACKED_FACTOR
        try:
            context_digest = await asyncio.to_thread(build_context.check, context, cap)
        except build_context.ContextRefused as exc:
            raise _invalid("context", str(exc)) from None
    images = {image.name: image.reference for image in for_tenant(settings, tenant)}
    try:
        checked = dockerfile_bases.check(body.dockerfile, images, default=DEFAULT)
    except dockerfile_bases.DockerfileRefused as exc:
        raise _invalid("dockerfile", str(exc)) from None
    # What the build reads: the canonical Dockerfile (its bases as Docker references), the
    # context's files and the arguments; and whose it is: a tag is never shared between
    # tenants, so no tenant's build can retag another's image.
    parts = [tenant, checked.dockerfile, context_digest, sorted(body.build_args.items())]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    row = models.ImageBuildRow(
        tenant_id=tenant,
        name=body.name,
        status="building",
        digest=digest,
        base=checked.base,
        reference=f"{REPOSITORY}:{digest}",
        dockerfile=checked.dockerfile,
        context=context,
        build_args=dict(body.build_args),
        description=body.description,
        image_config=None,
        error=None,
        log="",
        created_at=utc_now(),
        built_at=None,
    )
    return row, checked.bases


async def _store(
    sessions: Sessions, settings: Settings, row: models.ImageBuildRow
) -> models.ImageBuildRow | None:
    """Write the row as `building` (replacing the name's last build); the stored row instead
    when it is this very content, built. 409 while another build of the name runs, or past
    the tenant's count."""
    async with sessions.begin() as session:
        key = func.hashtextextended(f"image_builds:{row.tenant_id}", 0)
        await session.execute(select(func.pg_advisory_xact_lock(key)))
        now = await session.scalar(select(func.now()))
        old = await session.get(models.ImageBuildRow, (row.tenant_id, row.name))
        if old is not None:
            if old.status == "ready" and old.digest == row.digest:
                return old
            patience = timedelta(seconds=settings.image_build_timeout_s + REPLY_GRACE_S)
            if old.status == "building" and now is not None and old.created_at + patience > now:
                raise Conflict(
                    f"image {row.name!r} is being built already; ask again once it is done",
                    details={"name": row.name, "status": "building"},
                )
            await session.delete(old)
            await session.flush()
        else:
            count = await session.scalar(
                select(func.count())
                .select_from(models.ImageBuildRow)
                .where(models.ImageBuildRow.tenant_id == row.tenant_id)
            )
            if (count or 0) >= settings.tenant_max_image_builds:
                raise Conflict(
                    f"this tenant has {count} images, its limit"
                    f" (SANDHIVE_TENANT_MAX_IMAGE_BUILDS={settings.tenant_max_image_builds});"
                    " delete one first",
                    details={"limit": settings.tenant_max_image_builds},
                )
        session.add(row)
    return None


async def _fail(sessions: Sessions, row: models.ImageBuildRow, error: str) -> None:
    """Mark this build failed unless its worker wrote an outcome meanwhile."""
    async with sessions.begin() as session:
        stored = await session.get(models.ImageBuildRow, (row.tenant_id, row.name))
        if stored is not None and stored.digest == row.digest and stored.status == "building":
            stored.status, stored.error, stored.built_at = "failed", error, utc_now()


async def get(sessions: Sessions, tenant: str, name: str) -> ImageBuildOut:
    return out(await _find(sessions, tenant, name))


async def list_builds(sessions: Sessions, tenant: str) -> ImageBuildList:
    async with sessions() as session:
        found = await session.scalars(
            select(models.ImageBuildRow)
            .where(models.ImageBuildRow.tenant_id == tenant)
            .order_by(models.ImageBuildRow.created_at.desc())
        )
        return ImageBuildList(items=[out(row) for row in found])


async def remove(sessions: Sessions, tenant: str, name: str) -> None:
    """Forget it: no new sandbox starts from it (running ones keep their container; the
    Docker image stays on the workers' hosts until pruned)."""
    async with sessions.begin() as session:
        gone = await session.execute(
            delete(models.ImageBuildRow)
            .where(models.ImageBuildRow.tenant_id == tenant)
            .where(models.ImageBuildRow.name == name)
        )
    if not gone.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"image {name!r} not found")


@dataclass(frozen=True)
class Own:
    """One of the tenant's ready images, as the catalogue entry a sandbox resolves against,
    and what a worker lacking it needs to build it."""

    image: Image
    name: str
    base: str
    digest: str
    worker: str | None = None
    """The worker that built it: asked first, as it has the image."""

    def provenance(self) -> dict[str, str]:
        """What a sandbox's spec keeps of it (`built`)."""
        return {"name": self.name, "base": self.base, "digest": self.digest}


async def own_images(sessions: Sessions, settings: Settings, tenant: str) -> dict[str, Own]:
    """The tenant's ready images by `built/NAME`, each with its base's resources and
    limits."""
    async with sessions() as session:
        rows = await own.ready_rows(session, tenant)
    workers = {row.name: row.worker for row in rows}
    return {
        name: Own(
            found.image,
            found.built.name,
            found.built.base,
            found.built.digest,
            workers[found.built.name],
        )
        for name, found in own.resolved(settings, tenant, rows).items()
    }


async def _find(sessions: Sessions, tenant: str, name: str) -> models.ImageBuildRow:
    async with sessions() as session:
        row = await session.get(models.ImageBuildRow, (tenant, name))
    if row is None:
        raise NotFound(f"image {name!r} not found")
    return row


def out(row: models.ImageBuildRow) -> ImageBuildOut:
    config = row.image_config or {}
    return ImageBuildOut(
        name=row.name,
        image=BUILT_PREFIX + row.name,
        status=row.status,  # building, ready or failed
        error=row.error if row.status != "ready" else None,
        log=row.log,
        digest=row.digest,
        base=row.base,
        reference=row.reference,
        workdir=config.get("workdir"),
        user=config.get("user"),
        env=dict(config.get("env") or {}),
        description=row.description,
        created_at=row.created_at,
        built_at=row.built_at,
    )


def _invalid(field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}",
        details=[{"loc": ["body", field], "msg": message, "type": "invalid"}],
    )


async def stored(sessions: Sessions, tenant: str, name: str) -> models.ImageBuildRow | None:
    """The row a worker builds from (None: deleted meanwhile)."""
    async with sessions() as session:
        return await session.get(models.ImageBuildRow, (tenant, name))


async def record(
    sessions: Sessions,
    row: models.ImageBuildRow,
    *,
    worker: str,
    log: str,
    error: str | None = None,
    config: Mapping[str, object] | None = None,
) -> None:
    """A worker's outcome of the build it was asked for (nothing when the name was built
    again or deleted meanwhile)."""
    async with sessions.begin() as session:
        now = await session.get(models.ImageBuildRow, (row.tenant_id, row.name))
        if now is None or now.digest != row.digest:
            return
        now.status = "failed" if error is not None else "ready"
        now.error, now.log, now.worker, now.built_at = error, log, worker, utc_now()
        if config is not None:
            now.image_config = dict(config)
