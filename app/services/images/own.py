"""A tenant's own ready images (`built/NAME`, from `/v1/images/builds`) as what a sandbox or
a task resolves against: each is its base's catalogue entry under its own name and tag,
with the build's provenance a worker lacking the tag rebuilds it from.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import load_only

from app.config import Settings
from app.db import models
from app.domain.image_catalogue import Image, for_tenant
from app.domain.resolve import OwnImage
from app.schemas.images import BUILT_PREFIX
from app.specs import BuiltImage


def names_one(image: str) -> bool:
    """Whether a requested image is one of a tenant's own (worth a look in Postgres)."""
    return image.startswith(BUILT_PREFIX)


async def ready_rows(session: AsyncSession, tenant: str) -> list[models.ImageBuildRow]:
    """The tenant's ready builds, without their contexts and logs (megabytes each)."""
    row = models.ImageBuildRow
    found = await session.scalars(
        select(row)
        .options(
            load_only(
                row.tenant_id,
                row.name,
                row.status,
                row.base,
                row.digest,
                row.reference,
                row.description,
                row.worker,
            )
        )
        .where(row.tenant_id == tenant)
        .where(row.status == "ready")
    )
    return list(found)


def resolved(
    settings: Settings, tenant: str, rows: list[models.ImageBuildRow]
) -> dict[str, OwnImage]:
    """The rows whose base the tenant may still use, by `built/NAME`."""
    bases = {image.name: image for image in for_tenant(settings, tenant)}
    images: dict[str, OwnImage] = {}
    for row in rows:
        base = bases.get(row.base)
        if base is None:  # its base left the catalogue, or this tenant's share of it
            continue
        name = BUILT_PREFIX + row.name
        built = BuiltImage(name=row.name, base=row.base, digest=row.digest)
        images[name] = OwnImage(as_image(name, row, base), built)
    return images


async def own_images(
    session: AsyncSession, settings: Settings, tenant: str, *wanted: str
) -> dict[str, OwnImage]:
    """The tenant's ready images, when any of `wanted` names one (else no query at all)."""
    if not any(names_one(image) for image in wanted):
        return {}
    return resolved(settings, tenant, await ready_rows(session, tenant))


def as_image(name: str, row: models.ImageBuildRow, base: Image) -> Image:
    """The base's resources and limits under the build's name, tag and description."""
    return replace(
        base,
        name=name,
        reference=row.reference,
        description=row.description,
        warm_pool_size=0,
        tenants=None,
        dockerfile=None,
        context=None,
    )
