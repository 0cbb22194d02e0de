"""The warm pool: started, set-up, never-used sandboxes waiting for a task of their shape.

A worker keeps up to `size` ready sandboxes per sandbox shape (everything in a
`SandboxConfig` but its labels; `sizes` sets it per image, the catalogue's
`warm_pool_size`, 0 for none), refilled one at a time in the background. A shape
is learnt from the first task that asks for it (or `start`), at most `max_shapes`.
`claim` hands one out exactly once; the caller owns it from then on and removes it
after the task (never reused). Sandboxes older than `max_age_s` or whose exec
channel died are removed instead of handed out.

Labels cannot change after creation, so pooled containers carry the pool's labels
(`sandhive.pool=1`, the worker, the instance) and no task: the reaper removes them
only when their worker is dead (`app.worker.reaping`); while the worker lives, the
episode removes a claimed one and `close` removes the rest.

Nor can a container's deadline (`SandboxConfig.deadline_s`, its main command) change,
and a pooled sandbox is made before its task is known: it gets `max_age_s` (the most it
waits) plus `task_deadline_s` (the most any task's sandbox needs), and `claim` hands it
only to a task whose own deadline still fits in what is left of that.
Imported by the worker pool and `app.runner.episode`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, replace

from app import defaults
from app.errors import SandboxError
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.policy import SandboxConfig
from app.sandbox.reaper import INSTANCE_LABEL, POOL_LABEL, WORKER_LABEL

RETRY_PAUSE_S = 5.0
log = logging.getLogger(__name__)


def pool_labels(instance: str, worker: str) -> dict[str, str]:
    """The labels of one worker's pooled sandboxes (no task: it is not known yet)."""
    return {INSTANCE_LABEL: instance, WORKER_LABEL: worker, POOL_LABEL: "1"}


@dataclass
class _Warm:
    box: DockerSandbox
    born: float
    """Monotonic time from before its creation: its container's clock started after it."""

    def life_left(self, now: float) -> float:
        """A lower bound of the time until its container's deadline."""
        return self.box.config.deadline_s - (now - self.born)


def shape_of(config: SandboxConfig) -> str:
    """What two sandboxes must share to be interchangeable: all of the config but labels
    and the deadline (the pool's own; `claim` checks it is long enough)."""
    rest = replace(config, labels={}, env={}, deadline_s=defaults.SANDBOX_DEADLINE_S)
    return repr((rest, sorted(config.env.items())))


class WarmPool:
    """Ready sandboxes per shape for one worker; `claim` never blocks on Docker."""

    def __init__(
        self,
        host: DockerHost,
        *,
        size: int,
        labels: Mapping[str, str],
        sizes: Mapping[str, int] | None = None,
        max_age_s: float = defaults.WARM_POOL_MAX_AGE_S,
        task_deadline_s: float = defaults.SANDBOX_DEADLINE_S,
        max_shapes: int = 4,
        refill_after_s: float = 0.0,
    ) -> None:
        self._host = host
        self._size = size
        self._sizes = dict(sizes or {})
        """Per image reference (the catalogue's `warm_pool_size`); others get `size`."""
        self._labels = {**labels, POOL_LABEL: "1"}
        self._max_age_s = max_age_s
        self._deadline_s = max_age_s + task_deadline_s
        self._max_shapes = max_shapes
        self._refill_after_s = refill_after_s
        """After a claim, wait until none came for this long before refilling, while any
        shape still has one ready: containers started during a burst of claims take the
        CPU the burst's own requests need."""
        self._last_claim = 0.0
        self._closed = False
        self._shapes: dict[str, SandboxConfig] = {}
        self._ready: dict[str, list[_Warm]] = {}
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None

    def start(self, config: SandboxConfig) -> None:
        """Keep sandboxes of this shape ready (the filler starts on first use); nothing once
        closed (a claim racing a stop must not start a filler nobody closes)."""
        key = shape_of(config)
        if self.size_of(config) == 0 or self._closed:
            return  # this image keeps no warm sandboxes
        if key not in self._shapes and len(self._shapes) < self._max_shapes:
            self._shapes[key] = replace(config, labels=self._labels, deadline_s=self._deadline_s)
            self._ready[key] = []
        if self._filler is None:
            self._filler = asyncio.create_task(self._fill_forever())
        self._wake.set()

    def size_of(self, config: SandboxConfig) -> int:
        """How many sandboxes of this shape to keep ready: its image's size."""
        return self._sizes.get(config.image, self._size)

    def ready(self, config: SandboxConfig) -> int:
        """How many sandboxes of this shape wait now."""
        return len(self._ready.get(shape_of(config), []))

    async def wait_ready(self, config: SandboxConfig, timeout_s: float = 60.0) -> None:
        """Until the pool of this shape is full (benchmarks and tests)."""
        async with asyncio.timeout(timeout_s):
            while self.ready(config) < self.size_of(config):  # noqa: ASYNC110 - test/bench helper
                await asyncio.sleep(0.05)

    def claim(self, config: SandboxConfig, *, learn: bool = True) -> DockerSandbox | None:
        """A fresh sandbox of this shape that lives at least `config.deadline_s` more, now,
        or None (then, with `learn`, the shape is learnt for next time; without, only the
        shapes `start` was given are ever kept)."""
        if config.egress is not None and config.egress.proxy is not None:
            return None  # its network and the proxy's grant are its task's: never made ahead
        key = shape_of(config)
        if learn:
            self.start(config)
        elif key in self._shapes:
            self._wake.set()
        waiting = self._ready.get(key, [])
        now = time.monotonic()
        for item in list(waiting):
            if not self._usable(item):
                waiting.remove(item)
                self._discard(item)
            elif item.life_left(now) >= config.deadline_s:
                waiting.remove(item)
                self._last_claim = now
                self._wake.set()
                return item.box
        return None

    def _usable(self, item: _Warm) -> bool:
        young = time.monotonic() - item.born < self._max_age_s
        return young and (item.box.uses_channel or not self._host.exec_channel)

    def _discard(self, item: _Warm) -> None:
        task = asyncio.create_task(_remove(item.box))
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

    async def _fill_forever(self) -> None:
        """Top every shape up to `size`, one sandbox at a time; sweep the stale ones."""
        while True:
            self._wake.clear()
            await self._quiet()
            try:
                await self._fill_once()
            except SandboxError as exc:
                log.warning("warm pool could not start a sandbox: %s", exc.message)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            sweep = max(1.0, self._max_age_s / 4)
            try:
                async with asyncio.timeout(sweep):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _quiet(self) -> None:
        """Until `refill_after_s` passed without a claim, or a shape has none ready."""
        while self._refill_after_s > 0 and all(self._ready.values()):
            left = self._last_claim + self._refill_after_s - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()  # a claim meanwhile looks again: it may have taken the last
            with suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    async def _fill_once(self) -> None:
        for key, config in list(self._shapes.items()):
            waiting = self._ready[key]
            for item in [w for w in waiting if not self._usable(w)]:
                waiting.remove(item)
                self._discard(item)
            while len(waiting) < self.size_of(config):
                born = time.monotonic()
                creating = asyncio.ensure_future(self._host.create_sandbox(config))
                try:
                    box = await asyncio.shield(creating)
                except asyncio.CancelledError:
                    # `close` cut the filler while Docker made a container: it is removed
                    # once made, and `close` waits for that (`_PENDING`), leaving none behind.
                    task = asyncio.create_task(_remove_once_made(creating))
                    _PENDING.add(task)
                    task.add_done_callback(_PENDING.discard)
                    raise
                waiting.append(_Warm(box, born))
                log.debug("warm sandbox %s ready (%d waiting)", box.id[:12], len(waiting))

    async def close(self) -> None:
        """Stop refilling and remove every sandbox still waiting; it hands out none after."""
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.gather(self._filler, return_exceptions=True)
            self._filler = None
        boxes = [item.box for items in self._ready.values() for item in items]
        for items in self._ready.values():
            items.clear()
        await asyncio.gather(*(_remove(box) for box in boxes), *list(_PENDING))


_PENDING: set[asyncio.Task[None]] = set()


async def _remove_once_made(creating: asyncio.Future[DockerSandbox]) -> None:
    try:
        box = await creating
    except Exception:  # it failed: nothing was made
        return
    await _remove(box)


async def _remove(box: DockerSandbox) -> None:
    try:
        await box.remove()
    except SandboxError:
        log.warning("could not remove pooled sandbox %s; the reaper will", box.id[:12])
