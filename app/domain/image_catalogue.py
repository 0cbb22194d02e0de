"""The image catalogue: the sandbox images an operator offers, by name, and who may use which.

Read from the TOML file `SANDHIVE_SANDBOX_IMAGES_FILE` (docs/images.md); `default`
(the `SANDHIVE_SANDBOX_IMAGE` built from Dockerfile.sandbox) is always there, so a
server without the file behaves as it always did. Each image has a Docker
reference (pulled, or built from its own Dockerfile FROM the default image), a
description, default and maximum resources (the server's own where it says
nothing; never above the server's maxima), the tenants that may use it (all
unless listed) and a warm-pool size.

A leaf like `app.config`: the API (what a tenant may use), `app.domain.resolve` (422s),
the worker (which images its daemon has, caps per image) and the CLI read it.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.config import Settings

DEFAULT = "default"
N = TypeVar("N", int, float)
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
"""Image names: short, lower case, safe in a Redis key and a Docker tag."""


class ImageResources(BaseModel):
    """Resources of one image's sandboxes; each unset one is the server's setting."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(default=None, gt=0, le=1024)
    memory_mb: int | None = Field(default=None, ge=64)
    disk_mb: int | None = Field(default=None, ge=16)


class ImageEntry(BaseModel):
    """One `[images.NAME]` table of the catalogue file."""

    model_config = ConfigDict(extra="forbid")

    reference: str | None = Field(default=None, min_length=1, max_length=255)
    """The Docker image (`repo:tag`); with `dockerfile`, the tag it is built as."""
    dockerfile: Path | None = None
    """A Dockerfile built FROM the default image (`ARG BASE_IMAGE`); relative to the file."""
    context: Path | None = None
    """The build context directory (relative to the file); unset: only the Dockerfile."""
    description: str = Field(default="", max_length=1000)
    defaults: ImageResources = Field(default_factory=ImageResources)
    max: ImageResources = Field(default_factory=ImageResources)
    pids_limit: int | None = Field(default=None, ge=16)
    tenants: list[str] | None = None
    """Who may use it; unset: every tenant."""
    warm_pool_size: int | None = Field(default=None, ge=0, le=64)
    """Ready sandboxes per worker and shape of this image; unset: `SANDHIVE_WARM_POOL_SIZE`."""


@dataclass(frozen=True)
class Image:
    """A catalogue image with every default filled in: what the rest of Sandhive reads."""

    name: str
    reference: str
    description: str
    default_cpus: float
    max_cpus: float
    default_memory_mb: int
    max_memory_mb: int
    default_disk_mb: int
    max_disk_mb: int
    pids_limit: int
    warm_pool_size: int
    tenants: frozenset[str] | None = None
    dockerfile: Path | None = None
    context: Path | None = None

    def allows(self, tenant: str | None) -> bool:
        """Whether the tenant may use it (None: no tenant, `sandhive run`: any image)."""
        return tenant is None or self.tenants is None or tenant in self.tenants


class CatalogueError(ValueError):
    """The catalogue file is unreadable or wrong: the message says where."""


def catalogue(settings: Settings) -> dict[str, Image]:
    """Every image by name, `default` first (CatalogueError for a bad file)."""
    path = settings.sandbox_images_file
    entries: Mapping[str, ImageEntry] = {}
    if path is not None:
        try:
            mtime = path.stat().st_mtime_ns
        except OSError as exc:
            raise CatalogueError(f"image catalogue {path}: {exc.strerror}") from None
        entries = _read(path, mtime)
    images = {DEFAULT: _image(DEFAULT, entries.get(DEFAULT, ImageEntry()), settings, None)}
    for name, entry in entries.items():
        if name != DEFAULT:
            images[name] = _image(name, entry, settings, path)
    return images


def catalogue_or_default(settings: Settings) -> dict[str, Image]:
    """The catalogue; only `default` while the file is broken, for the worker: it keeps
    running default's tasks (its readiness `images` reports the file's error)."""
    try:
        return catalogue(settings)
    except CatalogueError:
        return {DEFAULT: _image(DEFAULT, ImageEntry(), settings, None)}


def allowed(images: Mapping[str, Image], tenant: str | None) -> list[str]:
    """The names the tenant may use, sorted."""
    return sorted(name for name, image in images.items() if image.allows(tenant))


def for_tenant(settings: Settings, tenant: str | None) -> list[Image]:
    """The images the tenant may use, by name."""
    images = catalogue(settings)
    return [images[name] for name in allowed(images, tenant)]


def warm_sizes(images: Mapping[str, Image]) -> dict[str, int]:
    """Warm sandboxes to keep per Docker reference (the pool knows references, not names):
    the largest size of the names that share one."""
    sizes: dict[str, int] = {}
    for image in images.values():
        sizes[image.reference] = max(sizes.get(image.reference, 0), image.warm_pool_size)
    return sizes


@functools.lru_cache(maxsize=8)
def _read(path: Path, mtime_ns: int) -> dict[str, ImageEntry]:
    """Parsed once per version of the file (keyed by mtime), not on every submit and attempt."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"image catalogue {path}: {exc}") from None
    tables = data.get("images", {})
    unknown = set(data) - {"images"}
    if unknown or not isinstance(tables, dict):
        raise CatalogueError(f"image catalogue {path}: only [images.NAME] tables are allowed")
    entries: dict[str, ImageEntry] = {}
    for name, table in tables.items():
        if not NAME_PATTERN.match(name):
            raise CatalogueError(f"image catalogue {path}: bad name {name!r} ({NAME_PATTERN})")
        try:
            entries[name] = ImageEntry.model_validate(table)
        except ValidationError as exc:
            raise CatalogueError(f"image catalogue {path}: images.{name}: {exc}") from None
    return entries


def _image(name: str, entry: ImageEntry, settings: Settings, path: Path | None) -> Image:
    s, low, high = settings, entry.defaults, entry.max
    image = Image(
        name=name,
        reference=_reference(name, entry, settings, path),
        description=entry.description or (_DEFAULT_DESCRIPTION if name == DEFAULT else ""),
        default_cpus=_pick(low.cpus, s.default_cpus),
        max_cpus=_pick(high.cpus, s.max_cpus),
        default_memory_mb=_pick(low.memory_mb, s.default_memory_mb),
        max_memory_mb=_pick(high.memory_mb, s.max_memory_mb),
        default_disk_mb=_pick(low.disk_mb, s.default_disk_mb),
        max_disk_mb=_pick(high.disk_mb, s.max_disk_mb),
        pids_limit=_pick(entry.pids_limit, s.sandbox_pids_limit),
        warm_pool_size=_pick(entry.warm_pool_size, s.warm_pool_size),
        tenants=frozenset(entry.tenants) if entry.tenants is not None else None,
        dockerfile=_beside(path, entry.dockerfile),
        context=_beside(path, entry.context),
    )
    for what in ("cpus", "memory_mb", "disk_mb"):
        if getattr(image, f"default_{what}") > getattr(image, f"max_{what}"):
            raise CatalogueError(f"image {name!r}: default {what} is above its maximum")
        if getattr(image, f"max_{what}") > getattr(settings, f"max_{what}"):
            # The server's maxima stay the ceiling of every image (and what OpenAPI says).
            setting = f"SANDHIVE_MAX_{what.upper()}"
            raise CatalogueError(f"image {name!r}: maximum {what} is above {setting}")
    return image


_DEFAULT_DESCRIPTION = "The server's sandbox image (Dockerfile.sandbox)."


def _reference(name: str, entry: ImageEntry, settings: Settings, path: Path | None) -> str:
    """`default` is always SANDHIVE_SANDBOX_IMAGE; another needs a reference or a Dockerfile."""
    if name == DEFAULT:
        if entry.reference or entry.dockerfile:
            raise CatalogueError("image 'default' is SANDHIVE_SANDBOX_IMAGE: no reference here")
        return settings.sandbox_image
    if entry.reference:
        return entry.reference
    if entry.dockerfile is None:
        raise CatalogueError(f"image catalogue {path}: images.{name} needs reference or dockerfile")
    return f"sandhive-image-{name}:latest"


def _beside(path: Path | None, target: Path | None) -> Path | None:
    """A path of the file, relative to the file's own directory."""
    if target is None or path is None:
        return target
    return target if target.is_absolute() else path.parent / target


def _pick(value: N | None, default: N) -> N:
    return default if value is None else value
