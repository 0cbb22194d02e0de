"""Which catalogue images this worker's Docker daemon has: the task streams it may read.

Learnt at start and again with every readiness check (`worker_ready_check_s`), so an
image built (or removed) on the host while the worker runs is picked up (or dropped)
within one interval. The worker claims only the tasks of images it has
(`app.bus.queue` keeps one stream per image): a task of an image no live worker has
waits queued instead of failing with Docker's "no such image". The missing ones are
reported by readiness (`images`) and in the heartbeat, which `GET /v1/images` reads.
"""

from __future__ import annotations

import logging

from app.bus import queue
from app.config import Settings
from app.domain.image_catalogue import DEFAULT, CatalogueError, catalogue
from app.errors import SandboxError
from app.sandbox.docker import DockerHost
from app.sandbox.image import has_image

log = logging.getLogger(__name__)


class ImageInventory:
    """The catalogue images present on one daemon, as of the last `refresh`."""

    def __init__(self, settings: Settings, docker: DockerHost) -> None:
        self._settings = settings
        self._docker = docker
        self.present: list[str] = []
        """Names of the catalogue images the daemon has, sorted."""
        self.missing: list[str] = []
        """Names of those it lacks (or could not be asked about), sorted."""
        self.problem: str | None = None
        """Why the catalogue could not be read, if it could not: only `default`'s tasks are
        claimed then (when its image is here), so a typo in the file stops no default task."""

    def streams(self) -> list[str]:
        """The task streams to read: those of the present images."""
        return queue.streams_of(self.present)

    async def refresh(self) -> None:
        """Ask the daemon about every catalogue image (one inspect each); when it does not
        answer, what it had is kept (it is asked again at the next check)."""
        try:
            images = catalogue(self._settings)
        except CatalogueError as exc:
            await self._fall_back(str(exc))
            return
        present: list[str] = []
        missing: list[str] = []
        for name, image in sorted(images.items()):
            try:
                found = await has_image(self._docker, image.reference)
            except SandboxError as exc:
                # The daemon is away: readiness's `docker` says so and nothing is claimed
                # meanwhile; what it has is asked again once it answers.
                log.warning("could not ask the daemon about image %s: %s", name, exc.message)
                return
            (present if found else missing).append(name)
        self._set(present, missing, None)

    async def _fall_back(self, problem: str) -> None:
        """A broken catalogue file: the default image (SANDHIVE_SANDBOX_IMAGE) is known
        without it, so its stream is still read; the rest wait for a fixed file."""
        try:
            found = await has_image(self._docker, self._settings.sandbox_image)
        except SandboxError as exc:
            log.warning("could not ask the daemon about the default image: %s", exc.message)
            return
        self._set([DEFAULT] if found else [], [] if found else [DEFAULT], problem)

    def readiness(self) -> str:
        """`ok` when every catalogue image is here; else what is missing and how to build it."""
        if self.problem is not None:
            fallback = "only default's tasks are claimed" if self.present else "none claimed"
            return f"failed: {self.problem} ({fallback})"
        if not self.missing:
            return "ok"
        names = ", ".join(self.missing)
        return f"missing: {names} (sandhive image build NAME); their tasks wait for a worker"

    def _set(self, present: list[str], missing: list[str], problem: str | None) -> None:
        if (present, missing, problem) != (self.present, self.missing, self.problem):
            log.info("catalogue images here: %s; missing: %s", present or "none", missing or "none")
        self.present, self.missing, self.problem = present, missing, problem
