"""The worker's sandbox service: start the sandboxes callers ask for, run their commands and
move their files (`/v1/sandboxes`).

Requests come from this worker's own list (`app.bus.files`, kind `sandboxes`), each answered
on its reply key. Its sandboxes live in `self.live`; a request for one it does not hold (any
more) is answered `gone`, and the API then reads the row. At most
`SANDHIVE_SANDBOX_MAX_CONCURRENT_REQUESTS` requests run per sandbox and
`SANDHIVE_SANDBOX_WORKER_MAX_CONCURRENT_REQUESTS` per worker; the rest wait their turn and are
dropped once their caller has stopped waiting. Removing a sandbox ends its row first, so
whoever asks about it meanwhile reads why it ended. The row is the truth about its deadline
and its end: `app.worker.sandboxes.upkeep` reads them every second.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from app import metrics
from app.bus import files as bus
from app.errors import AppError, SandboxError
from app.ids import utc_now
from app.runner.episode import sandbox_deadline_s
from app.sandbox import task_files
from app.sandbox.docker import DockerSandbox
from app.sandbox.policy import SANDBOX_LABEL, WRITABLE_LABEL, SandboxConfig, sandbox_config
from app.sandbox.pool import WarmPool, pool_labels
from app.sandbox.reaper import CREATED_LABEL, INSTANCE_LABEL, WORKER_LABEL
from app.sandbox.task_files import FileRefused
from app.schemas.files import FileList, FileWritten
from app.schemas.sandboxes import SandboxCreate
from app.services.sandboxes import service as rows
from app.worker.context import WorkerContext
from app.worker.sandboxes import commands, upkeep
from app.worker.sandboxes.builds import Builder

log = logging.getLogger(__name__)
KIND = "sandboxes"
BLOCK_S = 0.2
PAUSE_S = 1.0
UPKEEP_EVERY_S = 1.0
STOP_GRACE_S = 5.0
"""At a stop, how long answers in flight get once their sandboxes are removed."""
CHANNEL_CAP_BYTES = 64 * 1024
"""The exec channel's own capture per stream: `commands` keeps what the caller gets."""
POOLED = "pool"
"""`SANDBOX_LABEL`'s value on this server's warm sandboxes: a caller's sandbox once claimed,
so a successor under the worker's name removes them at its start (`upkeep.end_own`) as it
removes the others."""
REFILL_AFTER_S = 1.0
"""The warm pool refills once creates have paused this long (or it ran out)."""
Reply = dict[str, Any]


@dataclass
class Live:
    """A sandbox this worker holds."""

    id: str
    box: DockerSandbox
    expires_at: float
    """Epoch seconds: the row's `expires_at` as last read."""
    announced: float | None = None
    """The deadline `sandbox.expiring` was sent for (an extension past it sends another)."""


class SandboxServer:
    """Serves this worker's sandbox requests until `halt`; then removes what it holds."""

    def __init__(self, ctx: WorkerContext, builder: Builder) -> None:
        self.ctx = ctx
        self.halted = asyncio.Event()
        self.live: dict[str, Live] = {}
        self.starting = 0
        s = ctx.settings
        self._per_worker = asyncio.Semaphore(s.sandbox_worker_max_concurrent_requests)
        per_sandbox = s.sandbox_max_concurrent_requests
        self._per_sandbox: defaultdict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(per_sandbox)
        )
        self._answering: set[asyncio.Task[None]] = set()
        self.builder = builder
        self._cold_starts = asyncio.Semaphore(s.sandbox_start_concurrency)
        self.pool: WarmPool | None = None
        if s.sandbox_warm_pool_size > 0:
            self.pool = WarmPool(
                ctx.docker,
                size=s.sandbox_warm_pool_size,
                labels={**pool_labels(ctx.instance, ctx.name), SANDBOX_LABEL: POOLED},
                max_age_s=s.warm_pool_max_age_s,
                task_deadline_s=sandbox_deadline_s(s, s.sandbox_max_lifetime_s),
                max_shapes=1,
                refill_after_s=REFILL_AFTER_S,
            )

    def halt(self) -> None:
        self.halted.set()

    async def serve(self) -> None:
        if self.ctx.settings.sandbox_slots == 0:
            return
        loops = [
            asyncio.create_task(self._loop("requests", self._take_one)),
            asyncio.create_task(self._loop("upkeep", self._upkeep)),
        ]
        try:
            if self.pool is not None:
                self._warm_default_shape(self.pool)
            await self.halted.wait()
        finally:
            await asyncio.gather(*loops, return_exceptions=True)
            # Their commands end with their containers: the answers in flight come quickly.
            for held in list(self.live.values()):
                await self.remove(held, "worker_lost", f"its worker {self.ctx.name} stopped")
            if self.pool is not None:
                await self.pool.close()
            if self._answering:
                await asyncio.wait(self._answering, timeout=STOP_GRACE_S)
                for task in self._answering:
                    task.cancel()

    async def _loop(self, name: str, once: Callable[[], Awaitable[None]]) -> None:
        while not self.halted.is_set():
            try:
                await once()
            except (RedisError, OSError) as exc:
                log.warning("sandboxes (%s): lost touch with Redis: %r", name, exc)
                await self._pause(PAUSE_S)
            except Exception:
                log.exception("sandboxes (%s) failed", name)
                await self._pause(PAUSE_S)

    async def _pause(self, seconds: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self.halted.wait(), seconds)

    async def _upkeep(self) -> None:
        await self._pause(UPKEEP_EVERY_S)
        await upkeep.tick(self)

    async def _take_one(self) -> None:
        request = await bus.next_request(
            self.ctx.redis, self.ctx.name, timeout_s=BLOCK_S, kind=KIND
        )
        if request is None or await self._expired(request):
            return
        task = asyncio.create_task(self._answer(request))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _expired(self, request: dict[str, Any]) -> bool:
        try:
            return await bus.expired(self.ctx.redis, request)
        except (RedisError, OSError):
            return False

    async def _answer(self, request: dict[str, Any]) -> None:
        """Answer one request; creates, deletes, builds and urgent commands (a signal to a
        running command) take no sandbox's turn: they must not wait behind the very
        commands they end."""
        reply, sandbox_id = str(request.get("reply", "")), str(request.get("sandbox_id"))
        try:
            if request.get("op") in ("create", "delete", "build") or request.get("urgent"):
                final = await self._serve(request, reply)
            else:
                async with self._per_sandbox[sandbox_id], self._per_worker:
                    if await self._expired(request):
                        return  # it waited its turn past its caller's patience
                    final = await self._serve(request, reply)
        except Exception as exc:
            log.exception("sandbox request on %s failed", sandbox_id)
            final = {"failure": f"the worker failed: {type(exc).__name__}"}
        finally:
            if sandbox_id not in self.live:
                self._per_sandbox.pop(sandbox_id, None)
        if final is not None:
            with suppress(RedisError, OSError):
                await bus.answer(self.ctx.redis, reply, final)

    async def _serve(self, request: dict[str, Any], reply: str) -> Reply | None:
        op, sandbox_id = request.get("op"), str(request.get("sandbox_id"))
        if op == "create":
            return await self._create(sandbox_id, request)
        if op == "build":
            return await self.builder.answer(request)
        held = self.live.get(sandbox_id)
        if held is None:
            return _gone(self.ctx.name, sandbox_id)
        if op == "delete":
            await self.remove(held, "deleted", None)
            return {"deleted": True}
        try:
            if op == "exec":
                cap = self.ctx.settings.sandbox_exec_max_output_bytes
                answer = await commands.run(held.box, request, self.ctx.redis, reply, cap)
            else:
                answer = await self._file(held, str(op), request, reply)
        except FileRefused as refused:
            answer = {"refused": refused.kind, "message": refused.message, "path": request["path"]}
        except ValidationError:
            answer = {"refused": "failure", "message": "the sandbox answered something unreadable"}
        except SandboxError as exc:
            answer = {"failure": exc.message}
        # Removed meanwhile (deleted, expired): whatever the command saw, the sandbox is gone.
        return answer if sandbox_id in self.live else _gone(self.ctx.name, sandbox_id)

    async def _create(self, sandbox_id: str, request: dict[str, Any]) -> Reply:
        s = self.ctx.settings
        if len(self.live) + self.starting >= s.sandbox_slots:
            return {"full": True}
        self.starting += 1
        try:
            row = await rows.get(self.ctx.sessions, sandbox_id)
            if row is None or row.status != "starting":
                return {"failure": "the sandbox is no longer waiting to start"}
            wanted = rows.wanted(row)
            if wanted.built is not None:  # a tenant's own image, maybe not built here yet
                await self.builder.ensure(wanted.tenant, wanted.built, wanted.sandbox.image)
            box = await self._start(wanted, request)
            try:
                started = await rows.running(self.ctx.sessions, sandbox_id, self.ctx.name)
            except BaseException:
                await _remove_quietly(box)
                raise
            if started is None:  # the API gave up on it meanwhile
                await _remove_quietly(box)
                return {"failure": "the sandbox ended while it started"}
            self.live[sandbox_id] = Live(sandbox_id, box, wanted.expires_at.timestamp())
            metrics.SANDBOXES_LIVE.set(len(self.live))
            return {"created": True, "sandbox": rows.out(started).model_dump(mode="json")}
        except (SandboxError, ValueError) as exc:
            log.warning("could not start sandbox %s: %r", sandbox_id, exc)
            return {"failure": str(exc)}
        finally:
            self.starting -= 1

    def _warm_default_shape(self, pool: WarmPool) -> None:
        """Keep sandboxes of a create with no fields ready (the pool's one shape): the
        burst of creates the pool is sized for is there before its first request."""
        try:
            default = rows.new_row(self.ctx.settings, "pool", SandboxCreate())
            pool.start(self._config(rows.wanted(default)))
        except (AppError, ValueError) as exc:  # e.g. the catalogue keeps `default` from some
            log.warning("sandbox warm pool off: no default sandbox to keep ready: %s", exc)
            self.pool = None

    async def _start(self, wanted: rows.Wanted, request: dict[str, Any]) -> DockerSandbox:
        """A warm sandbox when the pool keeps its shape (only the default one: a caller's
        env or writable root is never kept ready); a new container otherwise, at most
        `SANDHIVE_SANDBOX_START_CONCURRENCY` at once (a burst of creates on a small host
        finishes one by one rather than all late together), and none for a create its
        caller gave up on while it waited its turn."""
        config, asked = self._config(wanted), time.monotonic()
        warm = self.pool.claim(config, learn=False) if self.pool is not None else None
        if warm is not None:
            metrics.observe_sandbox_start(time.monotonic() - asked, warm=True)
            log.info("sandbox %s is warm container %s", wanted.id, warm.id[:12])
            return warm
        queued = self._cold_starts.locked()
        async with self._cold_starts:
            if queued and not await self._still_wanted(wanted.id, request):
                raise ValueError("the sandbox is no longer waiting to start")
            made = await self.ctx.runner.docker.create_sandbox(config)
        metrics.observe_sandbox_start(time.monotonic() - asked, warm=False)
        return made

    async def _still_wanted(self, sandbox_id: str, request: dict[str, Any]) -> bool:
        """After its turn came: its caller still waits and its row still says `starting`."""
        if await self._expired(request):
            return False
        row = await rows.get(self.ctx.sessions, sandbox_id)
        return row is not None and row.status == "starting"

    def _config(self, wanted: rows.Wanted) -> SandboxConfig:
        """Its container: the catalogue image within the server's caps, labelled as a
        caller's own (no task), its main process ending at the lifetime cap."""
        runner, s = self.ctx.runner, self.ctx.settings
        box = wanted.sandbox
        lived = (utc_now() - wanted.created_at).total_seconds()
        labels = {
            INSTANCE_LABEL: self.ctx.instance,
            WORKER_LABEL: self.ctx.name,
            CREATED_LABEL: datetime.now(UTC).replace(microsecond=0).isoformat(),
            SANDBOX_LABEL: wanted.id,  # no task label: only its worker's death dooms it
        }
        writable = not wanted.read_only_rootfs  # admitted by the API's operator setting
        if writable:
            labels[WRITABLE_LABEL] = "1"
        caps = runner.caps_for(box.image_name if wanted.built is None else wanted.built["base"])
        if wanted.built is not None:  # a tenant's own image, within its base's caps
            caps = replace(caps, image=box.image)
        config = sandbox_config(
            caps,
            labels=labels,
            cpus=box.cpus,
            memory_mb=box.memory_mb,
            disk_mb=box.disk_mb,
            network=box.network,
            workdir=s.sandbox_workdir,
            deadline_s=sandbox_deadline_s(s, max(s.sandbox_max_lifetime_s - lived, 1.0)),
            allow_domains=tuple(box.allow_domains),
        )
        return replace(
            config,
            env={**config.env, **wanted.env},
            read_only_rootfs=config.read_only_rootfs and not writable,
            output_cap_bytes=CHANNEL_CAP_BYTES,
        )

    async def _file(self, held: Live, op: str, request: dict[str, Any], reply: str) -> Reply:
        s = self.ctx.settings
        box, path, timeout_s = held.box, str(request.get("path", "")), s.task_files_timeout_s
        if op == "list":
            listing = await task_files.list_dir(
                box,
                path or ".",
                max_entries=s.task_files_max_entries,
                timeout_s=timeout_s,
                anywhere=True,
            )
            return {"listing": FileList.model_validate(listing).model_dump()}
        if op == "write":
            content = base64.b64decode(str(request.get("content", "")), validate=True)
            written = await task_files.write_file(
                box,
                path,
                content,
                max_bytes=s.sandbox_files_max_bytes,
                timeout_s=timeout_s,
                anywhere=True,
            )
            return {"written": FileWritten.model_validate(written).model_dump()}
        if op == "read":
            return await self._read(held, path, reply)
        return {"failure": f"unknown operation {op!r}"}

    async def _read(self, held: Live, path: str, reply: str) -> Reply:
        redis, s = self.ctx.redis, self.ctx.settings
        started = stalled = False

        async def header(head: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await bus.answer(redis, reply, {"file": {"size": head["size"]}})

        async def chunk(data: bytes) -> None:
            nonlocal stalled
            if stalled or not await bus.room_for(
                redis, reply, ahead=commands.READ_AHEAD, timeout_s=s.task_files_timeout_s
            ):
                stalled = True
                return
            await bus.answer(redis, reply, {"chunk": base64.b64encode(data).decode()})

        try:
            sent = await task_files.read_file(
                held.box,
                path,
                max_bytes=s.sandbox_files_max_bytes,
                timeout_s=s.task_files_timeout_s,
                on_header=header,
                on_chunk=chunk,
                anywhere=True,
            )
        except (FileRefused, SandboxError) as exc:
            if not started:
                raise
            return {"abort": exc.message}
        if stalled:
            return {"abort": "the reader stopped taking the file's chunks"}
        return {"end": sent}

    async def remove(self, held: Live, reason: str, error: str | None) -> None:
        """End its row (the first end stands), then remove the container."""
        try:
            await rows.end(self.ctx.sessions, held.id, reason, error)
        except Exception:  # the sweep ends it: its worker holds it no more
            log.exception("sandboxes: could not end sandbox %s", held.id)
        await self.forget(held)

    async def forget(self, held: Live) -> None:
        """Remove the container of a sandbox whose row already ended."""
        self.live.pop(held.id, None)
        metrics.SANDBOXES_LIVE.set(len(self.live))
        await _remove_quietly(held.box)


def _gone(worker: str, sandbox_id: str) -> Reply:
    return {"gone": f"worker {worker} does not hold sandbox {sandbox_id} (any more)"}


async def _remove_quietly(box: DockerSandbox) -> None:
    try:
        await box.remove()
    except SandboxError as exc:  # its labels and its deadline see to it
        log.warning("could not remove sandbox container %s: %r", box.id[:12], exc)
