"""`sandhive image`: build and list the catalogue's sandbox images (docs/images.md).

`build` with no name builds `default` from Dockerfile.sandbox (as it always did, `--offline`
first building a Debian base with no registry); `build NAME` one catalogue image, `--all`
every one (`default` first: the others are built FROM it). `list` shows what the catalogue
offers and whether this host's daemon has each image. Imported by app.cli.main only.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from app.cli.common import fail
from app.config import Settings
from app.domain.image_catalogue import DEFAULT, CatalogueError, Image, catalogue
from app.errors import SandboxError

image_cli = typer.Typer(help="Sandbox images: the catalogue.", no_args_is_help=True)
console = Console()


@image_cli.command("build")
def image_build(
    name: Annotated[
        str | None, typer.Argument(help="A catalogue image (default: `default`).")
    ] = None,
    all_images: Annotated[
        bool, typer.Option("--all", help="Every catalogue image, `default` first.")
    ] = False,
    offline: Annotated[
        bool, typer.Option(help="First build the base from Debian packages (no registry).")
    ] = False,
    tag: Annotated[
        str | None, typer.Option(help="Image tag of `default` (default SANDHIVE_SANDBOX_IMAGE).")
    ] = None,
    base_image: Annotated[
        str | None, typer.Option(help="Override ARG BASE_IMAGE of `default`.")
    ] = None,
) -> None:
    """Build the sandbox image from Dockerfile.sandbox, or catalogue images (quick when
    nothing changed)."""
    from app.sandbox.image import OFFLINE_BASE, build_offline_base

    settings = Settings()
    if tag:
        settings = settings.model_copy(update={"sandbox_image": tag})
    chosen = _chosen(settings, name, all_images)
    if offline and chosen[0].name == DEFAULT:
        build_offline_base(OFFLINE_BASE)
        base_image = base_image or OFFLINE_BASE
    try:
        asyncio.run(_build(chosen, base_image, settings.sandbox_image))
    except SandboxError as exc:
        fail(exc.message)


def _chosen(settings: Settings, name: str | None, all_images: bool) -> list[Image]:
    """The images to build, `default` first; exits naming the catalogue's for an unknown one."""
    try:
        images = catalogue(settings)
    except CatalogueError as exc:
        fail(str(exc))
    if all_images:
        return list(images.values())
    found = images.get(name or DEFAULT)
    if found is None:
        fail(f"no image {name!r} in the catalogue; there are: {', '.join(sorted(images))}")
    return [found]


async def _build(images: list[Image], default_base: str | None, default_ref: str) -> None:
    from app.sandbox.docker import DockerHost
    from app.sandbox.image import build_catalogue_image

    async with DockerHost() as host:
        for image in images:
            base = default_base if image.name == DEFAULT else default_ref
            done = await build_catalogue_image(
                host,
                image,
                base_image=base,
                on_log=lambda line: console.print(line, markup=False, highlight=False),
            )
            console.print(f"{image.name}: {done}")


@image_cli.command("list")
def image_list() -> None:
    """The catalogue: each image's reference, resources, tenants, warm pool, and whether
    this host's Docker daemon has it."""
    settings = Settings()
    try:
        images = catalogue(settings)
    except CatalogueError as exc:
        fail(str(exc))
    present = asyncio.run(_present(list(images.values())))
    table = Table()
    # A name is what `sandbox.image` takes: never cut, however narrow the terminal.
    table.add_column("name", no_wrap=True, min_width=max(map(len, images), default=4))
    for column in ("reference", "here", "cpus", "memory MiB", "disk MiB", "pids"):
        table.add_column(column, no_wrap=True)
    for column in ("tenants", "warm", "description"):
        table.add_column(column)
    for image in images.values():
        table.add_row(
            image.name,
            image.reference,
            present.get(image.name, "?"),
            f"{image.default_cpus:g}/{image.max_cpus:g}",
            f"{image.default_memory_mb}/{image.max_memory_mb}",
            f"{image.default_disk_mb}/{image.max_disk_mb}",
            str(image.pids_limit),
            ", ".join(sorted(image.tenants)) if image.tenants is not None else "all",
            str(image.warm_pool_size),
            image.description,
        )
    out = Console()  # the terminal's width now (COLUMNS), not when the module was imported
    out.print(table)
    out.print("resources: default/maximum; here: whether this host's daemon has the image")


async def _present(images: list[Image]) -> dict[str, str]:
    """`yes`/`no` per image; none (shown `?`) when the daemon cannot be asked."""
    from app.sandbox.docker import DockerHost
    from app.sandbox.image import has_image

    found: dict[str, str] = {}
    try:
        async with DockerHost() as host:
            for image in images:
                found[image.name] = "yes" if await has_image(host, image.reference) else "no"
    except SandboxError as exc:
        console.print(f"cannot ask the Docker daemon: {exc.message}", markup=False)
    return found
