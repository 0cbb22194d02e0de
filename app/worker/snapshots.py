"""Step snapshots (`sandbox.snapshots: steps`): after each step of such a task, its
sandbox's writable files are stored (`app.services.tasks.snapshots`), so a fork can start
from any step without running its commands again (docs/fork.md).

A sink around the task's own: the loop reports a step, the snapshot is taken before it
asks the model for the next (no tool runs meanwhile), and that pause is the cost. A step
that changed no file (its tar the same as the last one stored) stores no second copy. A
snapshot over `SANDHIVE_SNAPSHOT_MAX_MB`, or one the sandbox fails to give, is skipped
(logged): a fork from that step must replay. Nothing of it ever fails the task.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import timedelta

from app.agent.types import EventSink, Step
from app.db.engine import Sessions
from app.errors import SandboxError
from app.ids import utc_now
from app.sandbox import snapshot
from app.services.tasks import snapshots as stored
from app.worker.context import WorkerContext
from app.worker.running import Running

log = logging.getLogger(__name__)


class SnapshottingSink:
    def __init__(
        self,
        inner: EventSink,
        running: Running,
        sessions: Sessions,
        task_id: str,
        attempt: int,
        max_bytes: int,
    ) -> None:
        self.inner, self.running, self.sessions = inner, running, sessions
        self.task_id, self.attempt, self.max_bytes = task_id, attempt, max_bytes
        self.stored: tuple[int, bytes] | None = None
        """The step whose row holds the newest tar, and the tar's digest."""

    async def step_started(self, index: int) -> None:
        await self.inner.step_started(index)

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        await self.inner.step_completed(step, next_index)
        box = self.running.sandbox
        if step.interrupted is not None or box is None:
            return
        try:
            archive = await snapshot.take(box, self.max_bytes)
            digest = hashlib.blake2b(archive, digest_size=16).digest()
            same = self.stored[0] if self.stored and self.stored[1] == digest else None
            await stored.save(
                self.sessions, self.task_id, self.attempt, step.index, archive, same_as=same
            )
            if same is None:
                self.stored = (step.index, digest)
        except SandboxError as exc:  # over the limit, or the sandbox broke: no snapshot
            log.warning("no snapshot of step %d of %s: %s", step.index, self.task_id, exc)

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        await self.inner.live(kind, data)


async def expire(ctx: WorkerContext) -> None:
    """Step snapshots older than `SANDHIVE_SNAPSHOT_RETENTION_S` go (any worker may)."""
    before = utc_now() - timedelta(seconds=ctx.settings.snapshot_retention_s)
    if gone := await stored.expire(ctx.sessions, before):
        log.info("expired %d step snapshots", gone)
