"""The worker pool: N slots on one event loop, each running one attempt at a time.

arq/saq's shape rather than a framework: a semaphore for slots, a TaskGroup for
attempts, a graceful stop on SIGTERM/SIGINT (stop claiming, let running
attempts finish), and a burst mode that returns once the queue is empty.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

from redis.asyncio import Redis

from app.bus import queue
from app.bus.queue import Claim
from app.config import Settings
from app.db.engine import create_engine, create_sessions
from app.sandbox.docker import DockerHost
from app.worker.attempt import WorkerContext, run_attempt

log = logging.getLogger(__name__)
CLAIM_BLOCK_MS = 1_000


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.worker_name or default_name()
        self.stopping = asyncio.Event()
        self.free_slots = asyncio.Semaphore(settings.worker_concurrency)

    def stop(self) -> None:
        """Stop claiming; attempts already running finish."""
        self.stopping.set()

    async def run(self, *, burst: bool = False) -> None:
        """Claim and run tasks until stopped (or, in burst mode, until the queue is empty)."""
        engine = create_engine(self.settings.database_url)
        redis = Redis.from_url(self.settings.redis_url)
        try:
            async with DockerHost() as docker:
                await docker.ping()
                await queue.ensure_group(redis)
                ctx = WorkerContext(
                    self.settings, create_sessions(engine), redis, docker, self.name
                )
                log.info(
                    "worker %s ready with %d slots", self.name, self.settings.worker_concurrency
                )
                await self._claim_loop(ctx, burst=burst)
        finally:
            await redis.aclose()
            await engine.dispose()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def _claim_loop(self, ctx: WorkerContext, *, burst: bool) -> None:
        async with asyncio.TaskGroup() as group:
            while not self.stopping.is_set():
                await self.free_slots.acquire()
                claim = await queue.claim(ctx.redis, self.name, block_ms=CLAIM_BLOCK_MS)
                if claim is None:
                    self.free_slots.release()
                    if burst:
                        break
                    continue
                group.create_task(self._attempt(ctx, claim))

    async def _attempt(self, ctx: WorkerContext, claim: Claim) -> None:
        try:
            await run_attempt(ctx, claim.task_id)
            await queue.ack(ctx.redis, claim)
        finally:
            self.free_slots.release()
