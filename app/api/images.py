"""`/v1/images`: the catalogue images a tenant may name in `sandbox.image` (docs/images.md).

Each with its description, default and maximum resources, and whether a live worker
has it (from the workers' heartbeats: the API never talks to Docker).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import Res, Tenant
from app.domain.image_catalogue import Image, for_tenant
from app.schemas.images import ImageList, ImageOut, ImageResourcesOut
from app.schemas.tasks import ErrorOut
from app.services.admin import service as admin

router = APIRouter(prefix="/v1", tags=["images"])

_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}}


@router.get("/images", responses=_ERRORS)
async def list_images(res: Res, tenant: Tenant) -> ImageList:
    """The images this tenant may use, by name, and whether some live worker has each."""
    images = for_tenant(res.settings, tenant)
    workers = await admin.list_workers(res.redis)
    here = {name for worker in workers for name in worker.images}
    return ImageList(images=[_out(image, image.name in here) for image in images])


def _out(image: Image, available: bool) -> ImageOut:
    return ImageOut(
        name=image.name,
        reference=image.reference,
        description=image.description,
        defaults=ImageResourcesOut(
            cpus=image.default_cpus,
            memory_mb=image.default_memory_mb,
            disk_mb=image.default_disk_mb,
        ),
        max=ImageResourcesOut(
            cpus=image.max_cpus, memory_mb=image.max_memory_mb, disk_mb=image.max_disk_mb
        ),
        pids_limit=image.pids_limit,
        available=available,
    )
