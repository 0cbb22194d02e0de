"""`/v1/images`: the catalogue images a tenant may name in `sandbox.image` (docs/images.md).

Each with its description, default and maximum resources, and whether a live worker
has it (from the workers' heartbeats: the API never talks to Docker).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response, status

from app.api.deps import Res, Tenant
from app.domain.image_catalogue import Image, for_tenant
from app.schemas.images import (
    BUILD_NAME,
    ImageBuildCreate,
    ImageBuildList,
    ImageBuildOut,
    ImageList,
    ImageOut,
    ImageResourcesOut,
)
from app.schemas.tasks import ErrorOut
from app.services.admin import service as admin
from app.services.sandboxes import builds

router = APIRouter(prefix="/v1", tags=["images"])

_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}}
_BUILD_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 409, 413, 422, 503)
}
BuildName = Annotated[str, Path(pattern=BUILD_NAME, description="The image's name (not `built/`).")]


@router.get("/images", responses=_ERRORS)
async def list_images(res: Res, tenant: Tenant) -> ImageList:
    """The images this tenant may use, by name, and whether some live worker has each;
    the tenant's own images (`built/NAME`) among them once built (a worker lacking one
    builds it when a sandbox of it starts there)."""
    images = for_tenant(res.settings, tenant)
    workers = await admin.list_workers(res.redis)
    here = {name for worker in workers for name in worker.images}
    listed = [_out(image, image.name in here) for image in images]
    own = await builds.own_images(res.sessions, res.settings, tenant)
    listed += [_out(it.image, it.base in here) for _, it in sorted(own.items())]
    return ImageList(images=listed)


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


@router.post(
    "/images/builds",
    status_code=status.HTTP_201_CREATED,
    responses={
        **_BUILD_ERRORS,
        200: {"model": ImageBuildOut, "description": "Already built from the same content"},
    },
)
async def build_image(
    body: ImageBuildCreate, res: Res, tenant: Tenant, response: Response
) -> ImageBuildOut:
    """Build a Dockerfile into one of the tenant's own images, `built/NAME`, which
    `POST /v1/sandboxes` can start (docs/images.md#tenant-images). Waits for the build:
    201 once built; 200 when this name is already built from the same content; 422
    `build_failed` with the log's end when a step fails. Only where the operator allows it
    (`SANDHIVE_IMAGE_BUILDS`; 403 `image_builds_disabled` otherwise)."""
    built, made = await builds.build(res.sessions, res.redis, res.settings, tenant, body)
    if not made:
        response.status_code = status.HTTP_200_OK
    return built


@router.get("/images/builds", responses=_ERRORS)
async def list_image_builds(res: Res, tenant: Tenant) -> ImageBuildList:
    """The tenant's own images, newest first, ready or not."""
    return await builds.list_builds(res.sessions, tenant)


@router.get("/images/builds/{name}", responses={**_ERRORS, 404: {"model": ErrorOut}})
async def get_image_build(name: BuildName, res: Res, tenant: Tenant) -> ImageBuildOut:
    """One of the tenant's own images and how its last build went (its log's end)."""
    return await builds.get(res.sessions, tenant, name)


@router.delete(
    "/images/builds/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**_ERRORS, 404: {"model": ErrorOut}},
)
async def delete_image_build(name: BuildName, res: Res, tenant: Tenant) -> Response:
    """Forget the image: no new sandbox starts from it; running ones keep theirs."""
    await builds.remove(res.sessions, tenant, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
