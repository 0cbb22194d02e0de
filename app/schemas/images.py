"""Wire models of `GET /v1/images`: the catalogue images a tenant may name in `sandbox.image`.

A leaf like `app.schemas.tasks`; the docstring under each field is its OpenAPI description.
Never an image's build details (Dockerfile, context) or who else may use it.
"""

from __future__ import annotations

from app.schemas.tasks import WireModel


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
