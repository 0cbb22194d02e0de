"""Wire models of `GET /v1/images`: the catalogue images a tenant may name in `sandbox.image`.

A leaf like `app.schemas.tasks`; the docstring under each field is its OpenAPI description.
Never an image's build details (Dockerfile, context) or who else may use it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from app.schemas.tasks import WireModel, _Strict


class ImageResourcesOut(WireModel):
    """Resources of the image's sandboxes (a task's `sandbox` fields)."""

    cpus: float
    """CPU cores."""
    memory_mb: int
    """Memory in MiB."""
    disk_mb: int
    """Size of /testbed in MiB (RAM-backed)."""


class ImageOut(WireModel):
    """One catalogue image this tenant may use."""

    name: str
    """What a task names in `sandbox.image`."""
    reference: str
    """The Docker image its sandboxes run (`sandhive-sandbox:latest` for `default`, unless
    the operator changed it): what a Dockerfile's `FROM` names (docs/harbor.md)."""
    description: str
    """What is in it, in the operator's words."""
    defaults: ImageResourcesOut
    """What a task gets when its `sandbox` does not say."""
    max: ImageResourcesOut
    """The most a task may ask for (422 above)."""
    pids_limit: int
    """Processes a sandbox of it may run at once."""
    available: bool
    """Whether a live worker has the image now; a task of an image no worker has waits
    queued until one does (it does not fail)."""


class ImageList(WireModel):
    """The images this tenant may use, by name."""

    images: list[ImageOut]
    """`default` among them unless the operator restricted it."""


BUILT_PREFIX = "built/"
"""A tenant's own image is named `built/NAME` in `sandbox.image`: never a catalogue name
(those have no slash), so an operator's new image cannot shadow it."""
BUILD_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class ImageBuildCreate(_Strict):
    """A Dockerfile and its build context, built into one of the tenant's own images."""

    name: str = Field(pattern=BUILD_NAME, examples=["hello-task"])
    """The image's name: sandboxes name it `built/NAME`. Building a name again replaces
    the image (sandboxes running the old one keep it)."""
    dockerfile: str = Field(min_length=1, examples=["FROM default\nRUN echo hi > /opt/hi\n"])
    """The Dockerfile's text. Every `FROM` names a catalogue image this tenant may use (by
    name or reference), `${BASE_IMAGE}` (the default image), or an earlier stage; nothing is
    pulled from a registry and `RUN` has no network."""
    context: str | None = None
    """The build context as a tar archive (gzip or plain), base64; none: the Dockerfile
    alone (`COPY` then has nothing to copy)."""
    build_args: dict[str, str] = Field(default_factory=dict, max_length=64)
    """`--build-arg` values (`BASE_IMAGE` is set by the server)."""
    description: str = Field(default="", max_length=1000)
    """Shown by `GET /v1/images`."""


class ImageBuildOut(WireModel):
    """One of the tenant's own images, and how its last build went."""

    name: str = Field(examples=["hello-task"])
    """Its name; `image` is what a sandbox names."""
    image: str = Field(examples=["built/hello-task"])
    """What `sandbox.image` of `POST /v1/sandboxes` names."""
    status: Literal["building", "ready", "failed"]
    """`building` while a worker builds it; `ready` to start sandboxes from; `failed`:
    `error` and `log` say why."""
    error: str | None
    """Why the build failed."""
    log: str
    """The end of Docker's build output (at most 64 KiB)."""
    digest: str
    """SHA-256 of the Dockerfile, context and build arguments: asking again with the same
    ones answers the image already built (200) instead of building it again."""
    base: str
    """The catalogue image its first `FROM` names: its resources and maxima apply."""
    reference: str
    """The Docker tag its sandboxes run."""
    workdir: str | None
    """The image's `WORKDIR` (none: not set)."""
    user: str | None
    """The image's `USER` (none: root)."""
    env: dict[str, str]
    """The image's `ENV`."""
    description: str
    """The builder's words."""
    created_at: datetime
    """When it was asked for."""
    built_at: datetime | None
    """When the build ended."""


class ImageBuildList(WireModel):
    """The tenant's own images, newest first."""

    items: list[ImageBuildOut]
    """Every image this tenant built (at most `SANDHIVE_TENANT_MAX_IMAGE_BUILDS`)."""
