"""The worker pool: N slots on one event loop, each running one attempt at a time.

arq/saq's shape rather than a framework: a slot count, a TaskGroup for
attempts, background chores (`app.kit.periodic`: heartbeat and lease renewal,
cancel watch, reconciliation, reaping, readiness checks), and a burst mode that
returns once the queue is empty. SIGTERM stops claiming, lets running attempts finish for
`worker_shutdown_grace_s`, then hands the rest back to the queue (a second
signal skips the grace).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, suppress
from typing import Protocol

from redis.exceptions import RedisError

from app import logs, metrics
from app.bus import leases, queue
from app.bus.queue import Claim
from app.config import Settings
from app.kit.periodic import Periodic, quietly
from app.resources import open_resources
from app.runner.episode import Runner, open_runner
from app.sandbox.pool import pool_labels
from app.services.admin import service as admin
from app.services.experiments import runner as experiment_runner
from app.worker import heartbeat, placement, reaping, scoring, snapshots, taking, webhook_sender
from app.worker.attempt import run_attempt
from app.worker.context import WorkerContext
from app.worker.egress_events import BlockedRecorder
from app.worker.episodes import sweep as episodes_sweep
from app.worker.episodes.service import EpisodeServer
from app.worker.files import FileServer
from app.worker.health import Readiness
from app.worker.images import ImageInventory
from app.worker.reconcile import Reconciler
from app.worker.running import End, Running, StopReason
from app.worker.sandboxes import upkeep as sandbox_upkeep
from app.worker.sandboxes.builds import Builder
from app.worker.sandboxes.server import SandboxServer
from app.worker.taking import Taken

log = logging.getLogger(__name__)
CLAIM_BLOCK_MS = 200
"""How long one read of the queue blocks: a stop waits for the read in flight, so an idle
worker exits this soon after SIGTERM (and Settings keeps the Redis socket timeout above it)."""
RECLAIM_EVERY_S = 1.0
RETRY_PAUSE_S = 1.0
MAX_BACKOFF_S = 5.0


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class OpenRunner(Protocol):
    """How a worker opens its `Runner` (Docker host, warm pool, model client) for its life:
    `app.runner.episode.open_runner`'s signature."""

    def __call__(
        self, settings: Settings, *, warm_labels: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[Runner]: ...


class Worker:
    def __init__(
        self,
        settings: Settings,
        readiness: Readiness | None = None,
        *,
        runner: OpenRunner = open_runner,
    ) -> None:
        """`runner`: `open_runner` (the local Docker daemon) unless a caller brings another
        host; bench/scale.py's workers run over an in-process stand-in sandbox."""
        self.settings = settings
        self._open_runner = runner
        self.readiness = readiness or Readiness()
        """What the worker's /readyz reports (`app.worker.health`)."""
        self.name = settings.worker_name or default_name()
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.task_ended = asyncio.Event()
        """Set when an attempt ends: the experiments chore runs at once (an experiment's
        next item need not wait for the tick), one run for however many ended meanwhile."""
        self.busy = 0
        self.running: dict[str, Running] = {}
        self._last_reclaim = 0.0
        self._backoff = 0.0
        self.images: ImageInventory | None = None
        self.builder: Builder | None = None
        """Builds tenants' own images here, for sandboxes and tasks (set once serving)."""
        """The catalogue images its daemon has (`app.worker.images`): it claims only theirs."""

    def stop(self) -> None:
        """Stop claiming; running attempts get the grace period (none on a second call)."""
        if self.stopping.is_set():
            self.hurry.set()
        self.stopping.set()
        self.slot_freed.set()

    async def run(self, *, burst: bool = False) -> None:
        """Claim and run tasks until stopped (or, in burst mode, until the queue is empty)."""
        s = self.settings
        warm_labels = pool_labels(s.instance_name(), self.name)
        async with open_resources(s) as res:
            try:
                async with self._open_runner(s, warm_labels=warm_labels) as runner:
                    await runner.docker.ping()
                    ctx = WorkerContext.of(res, runner, self.name, s.instance_name())
                    runner.docker.egress_gate.on_blocked = BlockedRecorder(res.sessions, res.redis)
                    await self._serve(ctx, burst=burst)
            finally:
                with suppress(RedisError, OSError):
                    await leases.forget(res.redis, self.name)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def _serve(self, ctx: WorkerContext, *, burst: bool) -> None:
        await quietly("start", self._keep_alive(ctx))  # alive before any sandbox exists
        await quietly("create the queue", queue.ensure_group(ctx.redis))
        self.images = ImageInventory(self.settings, ctx.docker)
        await quietly("find the images", self._check_images(ctx))
        await quietly("end own episodes", episodes_sweep.end_own(ctx))
        await quietly("end own sandboxes", sandbox_upkeep.end_own(ctx))
        await quietly("remove own warm pool", reaping.remove_own_pool(ctx))
        reconciler = Reconciler(ctx)
        s = self.settings
        chores = Periodic()
        chores.start(s.worker_heartbeat_s, "heartbeat", lambda: self._keep_alive(ctx))
        chores.start(
            s.worker_cancel_poll_s,
            "cancel watch",
            lambda: heartbeat.watch_cancels(ctx, self.running),
        )
        chores.start(s.worker_reconcile_interval_s, "reconcile", reconciler.run_once)
        chores.start(s.worker_reap_interval_s, "reap", lambda: reaping.reap(ctx, self.running))
        chores.start(s.worker_reap_interval_s, "episode sweep", lambda: episodes_sweep.sweep(ctx))
        chores.start(s.worker_reap_interval_s, "sandbox sweep", lambda: sandbox_upkeep.sweep(ctx))
        chores.start(s.worker_reap_interval_s, "snapshot expiry", lambda: snapshots.expire(ctx))
        chores.start(s.worker_ready_check_s, "readiness", lambda: self.readiness.check(ctx))
        chores.start(s.worker_ready_check_s, "images", lambda: self._check_images(ctx))
        chores.start(
            s.experiment_tick_s,
            "experiments",
            lambda: experiment_runner.advance_all(ctx.sessions, ctx.redis, s),
            wake=self.task_ended,
        )
        chores.start(s.experiment_tick_s, "scoring", lambda: scoring.score_waiting(ctx))
        chores.start(s.webhook_poll_s, "webhooks", lambda: webhook_sender.send_due(ctx.sessions, s))
        metrics.SLOTS.set(s.worker_concurrency)
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop or asyncio
        log.info("worker %s ready with %d slots on %s", self.name, s.worker_concurrency, loop)
        episodes = EpisodeServer(ctx, self.stopping, lambda: self._present_images())
        files = FileServer(ctx, self.running)
        self.builder = Builder(ctx)
        own = SandboxServer(ctx, self.builder)
        serving = [
            asyncio.create_task(episodes.serve()),
            asyncio.create_task(files.serve()),
            asyncio.create_task(own.serve()),
        ]
        try:
            await self._claim_loop(ctx, burst=burst)
        finally:
            episodes.halt()
            files.halt()
            own.halt()
            await asyncio.gather(*serving, return_exceptions=True)
            await chores.stop()
        log.info("worker %s stopped", self.name)

    async def _keep_alive(self, ctx: WorkerContext) -> None:
        images = self.images.present if self.images is not None else []
        await heartbeat.keep_alive(ctx, self.running, images)
        if not self.stopping.is_set() and await admin.draining(ctx.redis, self.name):
            log.info("worker %s is drained by an operator: no new tasks", self.name)
            self.stop()

    async def _claim_loop(self, ctx: WorkerContext, *, burst: bool) -> None:
        async with asyncio.TaskGroup() as group:
            while not self.stopping.is_set():
                if self.busy >= self.settings.worker_concurrency:
                    await self._wait_for_slot()
                    continue
                # Not ready, or no catalogue image here: leave tasks to other workers.
                if self.readiness.docker_lost() or not self._streams():
                    if burst and not self.busy:
                        break  # a burst worker that can run nothing is done
                    await self._wait_for_slot()
                    continue
                taken = await self._take(ctx, burst=burst)
                if taken is None:
                    if burst and not self.busy:
                        break
                    continue
                if not await self._may_start(ctx, taken):
                    continue
                self.busy += 1
                running = Running(taken.claim, taken.holder)
                self.running[taken.task_id] = running  # its lease is renewed from now on
                group.create_task(self._attempt(ctx, running))
            if self.stopping.is_set():
                group.create_task(self._hand_back_after_grace())

    async def _check_images(self, ctx: WorkerContext) -> None:
        """Learn which catalogue images the daemon has; read (and create) only their queues."""
        assert self.images is not None
        before = self.images.streams()
        await self.images.refresh()
        self.readiness.record({"images": self.images.readiness()})
        if (after := self.images.streams()) != before:  # else claims recreate a lost group
            await queue.ensure_group(ctx.redis, after)

    def _present_images(self) -> list[str]:
        return self.images.present if self.images is not None else []

    def _streams(self) -> list[str]:
        return self.images.streams() if self.images is not None else []

    async def _wait_for_slot(self) -> None:
        self.slot_freed.clear()
        with suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self.slot_freed.wait()

    async def _take(self, ctx: WorkerContext, *, burst: bool) -> Taken | None:
        """The next task, leased (a dead worker's first when a reclaim is due); None if none."""
        reclaim = burst or time.monotonic() - self._last_reclaim >= RECLAIM_EVERY_S
        if reclaim:
            self._last_reclaim = time.monotonic()
        try:
            taken = await taking.take(
                ctx.redis,
                self.name,
                lease_ms=int(self.settings.worker_lease_s * 1000),
                reclaim=reclaim,
                block_ms=CLAIM_BLOCK_MS,
                running=self.running,
                streams=self._streams(),
            )
        except (RedisError, OSError) as exc:
            self._backoff = min(max(self._backoff * 2, 0.2), MAX_BACKOFF_S)
            log.warning("cannot read the queue (%r); retrying in %.1f s", exc, self._backoff)
            with suppress(TimeoutError):  # a stop ends the pause
                async with asyncio.timeout(self._backoff):
                    await self.stopping.wait()
            return None
        self._backoff = 0.0
        return taken

    async def _may_start(self, ctx: WorkerContext, taken: Taken) -> bool:
        """Whether to start a task just taken; if not, it is left to its attempt or given back."""
        if taken.already_running:
            await quietly("keep one attempt", self._keep_one(ctx, taken))
            return False
        if taken.reclaimed:  # a dead worker's task (this worker's own was handled above)
            log.info("reclaimed %s: its lease expired", taken.task_id)
            metrics.RECLAIMED.inc()
        # The stop came, or Docker went away, while the read waited: back to the queue.
        if self.stopping.is_set() or self.readiness.docker_lost():
            await quietly("hand back", taking.give_back(ctx.redis, taken))
            return False
        return await self._image_is_here(ctx, taken)

    async def _image_is_here(self, ctx: WorkerContext, taken: Taken) -> bool:
        """False after moving a task of an image this host lacks to that image's stream."""
        try:
            image = await placement.foreign_image(ctx.sessions, taken, self._present_images())
        except Exception:  # Postgres away: back to the queue rather than a guess
            log.exception("could not read the image of %s; handing it back", taken.task_id)
            await quietly("hand back", taking.give_back(ctx.redis, taken))
            return False
        if image is None:
            return True
        await quietly("move to its image", placement.send_to_image(ctx.redis, taken, image))
        return False

    async def _keep_one(self, ctx: WorkerContext, taken: Taken) -> None:
        """This worker took a task it already runs (`take` left it unleased): no second attempt.

        Its own message back through XAUTOCLAIM (the loop stalled past the lease):
        nothing to do, the attempt's renewals keep lease and message. Another
        message (reconciliation queued the task again meanwhile): acked, dropped.
        """
        running = self.running.get(taken.task_id)
        if running is not None and _origin(running.claim) == _origin(taken.claim):
            log.warning("took back its own message of %s: its lease lapsed", taken.task_id)
            return
        log.warning("took %s again while running it: a duplicate message, dropped", taken.task_id)
        await queue.ack(ctx.redis, taken.claim.message_id, taken.claim.stream)

    async def _attempt(self, ctx: WorkerContext, running: Running) -> None:
        logs.bind(task_id=running.task_id, worker=self.name)  # this asyncio task's lines only
        metrics.RUNNING.inc()
        try:
            await self._run_taken(ctx, running)
        except (RedisError, OSError) as exc:  # the message stays pending: it will be reclaimed
            log.warning("lost touch with Redis while handling %s: %r", running.task_id, exc)
        except Exception:  # nothing may escape into the TaskGroup
            log.exception("attempt of %s failed outside run_attempt", running.task_id)
        finally:
            metrics.RUNNING.dec()
            self.busy -= 1
            self.slot_freed.set()

    async def _run_taken(self, ctx: WorkerContext, running: Running) -> None:
        """Run a task taken by `taking.take`, then drop its lease and message as its end says."""
        try:
            end = await run_attempt(ctx, running, self.builder)
        finally:
            del self.running[running.task_id]
        if end is End.done:
            self.task_ended.set()
        metrics.ATTEMPTS.labels(end.name).inc()
        if end is End.retry:
            await asyncio.sleep(RETRY_PAUSE_S)
        if end is not End.stale:
            requeue = end in (End.hand_back, End.retry)
            claim = running.claim
            await leases.release(
                ctx.redis,
                claim.task_id,
                running.holder,
                claim.message_id,
                requeue=requeue,
                stream=claim.stream,
            )

    async def _hand_back_after_grace(self) -> None:
        """After the grace period, stop what still runs; each attempt hands its task back."""
        grace = self.settings.worker_shutdown_grace_s
        log.info("stopping: %d attempts get %.0f s to finish", len(self.running), grace)
        with suppress(TimeoutError):
            async with asyncio.timeout(grace):
                while self.busy and not self.hurry.is_set():
                    await self._wait_for_slot()
        for item in self.running.values():
            item.request_stop(StopReason.hand_back)


def _origin(claim: Claim) -> tuple[str, str]:
    """A message's identity: ids are numbered per stream, so the stream is part of it."""
    return claim.stream, claim.message_id
