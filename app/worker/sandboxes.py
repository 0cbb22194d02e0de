"""The worker's sandbox service: start the sandboxes callers ask for, run their commands and
move their files, remove them at their deadline (`/v1/sandboxes`).

Requests come from this worker's own list (`app.bus.files`, kind `sandboxes`), each answered
on its reply key. Its sandboxes live in `self.live`; a request for one it does not hold is
answered `gone` (the API then reads the row: ended, or lost). Commands of one sandbox run
side by side, as a shell's background jobs would. The row's `expires_at` is the deadline:
once the one held here passes, the row is read again (the API moved it on an extension)
and the sandbox removed only if it has really passed. Its container carries its worker's
label and no task's, so the reaper removes it once this worker is gone; and its main
process ends at the lifetime cap, so the daemon removes it even if no worker is left.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from app import metrics
from app.bus import files as bus
from app.bus import leases
from app.errors import SandboxError
from app.ids import utc_now
from app.runner.episode import sandbox_deadline_s
from app.sandbox import task_files
from app.sandbox.docker import DockerSandbox
from app.sandbox.policy import SANDBOX_LABEL, WRITABLE_LABEL, sandbox_config
from app.sandbox.reaper import CREATED_LABEL, INSTANCE_LABEL, WORKER_LABEL
from app.sandbox.task_files import FileRefused
from app.schemas.files import FileList, FileWritten
from app.services.sandboxes import service as rows
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)
KIND = "sandboxes"
BLOCK_S = 0.2
PAUSE_S = 1.0
EXPIRY_EVERY_S = 1.0
READ_AHEAD = 16
"""Chunks of a read or a stream waiting in Redis for their reader, at most."""
Reply = dict[str, Any]


@dataclass
class Held:
    id: str
    box: DockerSandbox
    expires_at: float
    """Epoch seconds; the row's `expires_at` when last read or told."""
    announced: float | None = None
    """The deadline `sandbox.expiring` was sent for (an extension past it sends another)."""


class SandboxServer:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.halted = asyncio.Event()
        self.live: dict[str, Held] = {}
        self.starting = 0

    def halt(self) -> None:
        self.halted.set()

    async def serve(self) -> None:
        """Until the pool halts it; then every sandbox it holds is removed and ended."""
        if self.ctx.settings.sandbox_slots == 0:
            return
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._requests(group))
                group.create_task(self._expiries())
        finally:
            for held in list(self.live.values()):
                await self._remove(held, "worker_lost", f"its worker {self.ctx.name} stopped")

    async def _requests(self, group: asyncio.TaskGroup) -> None:
        while not self.halted.is_set():
            try:
                request = await bus.next_request(
                    self.ctx.redis, self.ctx.name, timeout_s=BLOCK_S, kind=KIND
                )
            except (RedisError, OSError) as exc:
                log.warning("sandboxes: lost touch with Redis: %r", exc)
                await asyncio.sleep(PAUSE_S)
                continue
            if request is not None and not await self._expired(request):
                group.create_task(self._answer(request))

    async def _expired(self, request: dict[str, Any]) -> bool:
        try:
            return await bus.expired(self.ctx.redis, request)
        except (RedisError, OSError):
            return False

    async def _answer(self, request: dict[str, Any]) -> None:
        reply = str(request.get("reply", ""))
        try:
            final = await self._serve(request, reply)
        except Exception as exc:
            log.exception("sandbox request on %s failed", request.get("sandbox_id"))
            final = {"failure": f"the worker failed: {type(exc).__name__}: {exc}"}
        if final is not None:
            with suppress(RedisError, OSError):
                await bus.answer(self.ctx.redis, reply, final)

    async def _serve(self, request: dict[str, Any], reply: str) -> Reply | None:
        op, sandbox_id = request.get("op"), str(request.get("sandbox_id"))
        if op == "create":
            return await self._create(sandbox_id)
        held = self.live.get(sandbox_id)
        if held is None:
            return {"gone": f"worker {self.ctx.name} does not hold sandbox {sandbox_id}"}
        if op == "delete":
            await self._remove(held, "deleted", None)
            return {"deleted": True}
        if op == "ttl":
            held.expires_at = float(request.get("expires_at", held.expires_at))
            return None
        if op == "exec":
            return await self._exec(held, request, reply)
        try:
            return await self._file(held, op, request, reply)
        except FileRefused as refused:
            return {"refused": refused.kind, "message": refused.message, "path": request["path"]}
        except ValidationError:
            return {"refused": "failure", "message": "the sandbox answered something unreadable"}
        except SandboxError as exc:
            if sandbox_id not in self.live:
                return {"gone": "the sandbox was removed while its file was being accessed"}
            return {"failure": exc.message}

    async def _create(self, sandbox_id: str) -> Reply:
        s = self.ctx.settings
        if len(self.live) + self.starting >= s.sandbox_slots:
            return {"full": True}
        self.starting += 1
        try:
            row = await rows.get(self.ctx.sessions, sandbox_id)
            if row is None or row.status != "starting":
                return {"failure": "the sandbox is no longer waiting to start"}
            wanted = rows.wanted(row)
            box = await self._start(wanted)
            started = await rows.running(self.ctx.sessions, sandbox_id, self.ctx.name)
            if started is None:  # the API gave up on it meanwhile
                await _remove_quietly(box)
                return {"failure": "the sandbox ended while it started"}
            self.live[sandbox_id] = Held(sandbox_id, box, wanted.expires_at.timestamp())
            metrics.SANDBOXES_LIVE.set(len(self.live))
            return {"created": True}
        except (SandboxError, ValueError) as exc:
            log.warning("could not start sandbox %s: %r", sandbox_id, exc)
            return {"failure": str(exc)}
        finally:
            self.starting -= 1

    async def _start(self, wanted: rows.Wanted) -> DockerSandbox:
        runner, s = self.ctx.runner, self.ctx.settings
        box = wanted.sandbox
        lived = (utc_now() - wanted.created_at).total_seconds()
        labels = {
            INSTANCE_LABEL: self.ctx.instance,
            WORKER_LABEL: self.ctx.name,
            CREATED_LABEL: datetime.now(UTC).replace(microsecond=0).isoformat(),
            SANDBOX_LABEL: wanted.id,  # no task label: only its worker's death dooms it
        }
        config = sandbox_config(
            runner.caps_for(box.image_name),
            labels=labels,
            cpus=box.cpus,
            memory_mb=box.memory_mb,
            disk_mb=box.disk_mb,
            network=box.network,
            workdir=s.sandbox_workdir,
            deadline_s=sandbox_deadline_s(s, max(s.sandbox_max_lifetime_s - lived, 1.0)),
            allow_domains=tuple(box.allow_domains),
        )
        writable = not wanted.read_only_rootfs  # admitted by the API's operator setting
        if writable:
            labels[WRITABLE_LABEL] = "1"
        config = replace(
            config,
            labels=labels,
            env={**config.env, **wanted.env},
            read_only_rootfs=config.read_only_rootfs and not writable,
            output_cap_bytes=s.sandbox_exec_max_output_bytes,
        )
        asked = time.monotonic()
        made = await runner.docker.create_sandbox(config)
        metrics.observe_sandbox_start(time.monotonic() - asked, warm=False)
        return made

    async def _exec(self, held: Held, request: dict[str, Any], reply: str) -> Reply | None:
        cap = int(request.get("max_output") or self.ctx.settings.sandbox_exec_max_output_bytes)
        out, err = _Head(cap), _Head(cap)
        stream = bool(request.get("stream"))
        stalled = False

        async def on_output(name: str, data: bytes) -> None:
            nonlocal stalled
            kept = (err if name == "stderr" else out).add(data)
            if not stream or not kept or stalled:
                return
            if not await bus.room_for(
                self.ctx.redis,
                reply,
                ahead=READ_AHEAD,
                timeout_s=self.ctx.settings.task_files_timeout_s,
            ):
                stalled = True  # nobody reads the stream: the command runs on, unread
                return
            chunk = {"stream": name, "data": base64.b64encode(kept).decode()}
            await bus.answer(self.ctx.redis, reply, {"output": chunk})

        stdin = request.get("stdin")
        started = time.monotonic()
        try:
            done = await held.box.exec(
                [str(arg) for arg in request["argv"]],
                workdir=str(request.get("cwd") or held.box.config.workdir),
                env={str(k): str(v) for k, v in (request.get("env") or {}).items()},
                stdin=base64.b64decode(stdin) if stdin is not None else None,
                timeout_s=float(request["timeout_s"]),
                on_output=on_output,
                user=request.get("user"),
            )
        except SandboxError as exc:
            if held.id not in self.live:
                return {"gone": "the sandbox was removed while the command ran"}
            return {"failure": exc.message}
        duration_ms = int((time.monotonic() - started) * 1000)
        metrics.SANDBOX_COMMANDS.inc()
        metrics.SANDBOX_COMMAND_SECONDS.observe(duration_ms / 1000)
        return {
            "exit": {
                "exit_code": None if done.timed_out else done.exit_code,
                "timed_out": done.timed_out,
                "stdout": "" if stream else base64.b64encode(out.value()).decode(),
                "stderr": "" if stream else base64.b64encode(err.value()).decode(),
                "stdout_truncated": out.truncated,
                "stderr_truncated": err.truncated,
                "duration_ms": duration_ms,
            }
        }

    async def _file(
        self, held: Held, op: object, request: dict[str, Any], reply: str
    ) -> Reply | None:
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

    async def _read(self, held: Held, path: str, reply: str) -> Reply | None:
        redis, s = self.ctx.redis, self.ctx.settings
        started = stalled = False

        async def header(head: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await bus.answer(redis, reply, {"file": {"size": head["size"]}})

        async def chunk(data: bytes) -> None:
            nonlocal stalled
            if stalled or not await bus.room_for(
                redis, reply, ahead=READ_AHEAD, timeout_s=s.task_files_timeout_s
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

    async def _expiries(self) -> None:
        """Every `EXPIRY_EVERY_S`: remove the sandboxes whose deadline, read again, passed."""
        while not self.halted.is_set():
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.halted.wait(), EXPIRY_EVERY_S)
            now = time.time()
            await self._announce_expiring(now)
            for held in [h for h in self.live.values() if h.expires_at <= now]:
                try:
                    row = await rows.get(self.ctx.sessions, held.id)
                except Exception:
                    log.exception("sandboxes: could not read sandbox %s", held.id)
                    continue
                if row is not None and row.status == "running":
                    held.expires_at = row.expires_at.timestamp()
                    if held.expires_at > now:
                        continue
                await self._remove(held, "expired", None)

    async def _announce_expiring(self, now: float) -> None:
        """`sandbox.expiring` once per deadline, `SANDHIVE_WEBHOOK_EXPIRING_LEAD_S` before it
        (the row read again first: an extension moves it)."""
        lead = self.ctx.settings.webhook_expiring_lead_s
        for held in list(self.live.values()):
            if held.announced == held.expires_at or held.expires_at - lead > now:
                continue
            try:
                found = await rows.expiring(self.ctx.sessions, held.id, lead)
            except Exception:
                log.exception("sandboxes: could not announce the expiry of %s", held.id)
                continue
            if found is not None:
                expires_at, announced = found
                held.expires_at = expires_at.timestamp()
                if announced:
                    held.announced = held.expires_at

    async def _remove(self, held: Held, reason: str, error: str | None) -> None:
        """Remove the container and end the row (the first end stands)."""
        self.live.pop(held.id, None)
        metrics.SANDBOXES_LIVE.set(len(self.live))
        await _remove_quietly(held.box)
        try:
            await rows.end(self.ctx.sessions, held.id, reason, error)
        except Exception:  # the sweep ends it later: its worker holds it no more
            log.exception("sandboxes: could not end sandbox %s", held.id)


class _Head:
    """The first `cap` bytes of a stream, and whether more came."""

    def __init__(self, cap: int) -> None:
        self.cap, self.kept, self.truncated = cap, bytearray(), False

    def add(self, data: bytes) -> bytes:
        """Keep what fits; the part kept."""
        room = self.cap - len(self.kept)
        kept = data[: max(room, 0)]
        self.kept += kept
        if len(kept) < len(data):
            self.truncated = True
        return kept

    def value(self) -> bytes:
        return bytes(self.kept)


async def _remove_quietly(box: DockerSandbox) -> None:
    try:
        await box.remove()
    except SandboxError as exc:  # its labels and its deadline see to it
        log.warning("could not remove sandbox container %s: %r", box.id[:12], exc)


async def end_own(ctx: WorkerContext) -> list[str]:
    """At start: the sandboxes the rows say this worker holds (a predecessor under the same
    name held them) are lost; their containers go now."""
    ended = []
    for sandbox_id in await rows.active_on(ctx.sessions, ctx.name):
        if await rows.end(
            ctx.sessions, sandbox_id, "worker_lost", "infrastructure: its worker restarted"
        ):
            ended.append(sandbox_id)
    labels = {INSTANCE_LABEL: ctx.instance, WORKER_LABEL: ctx.name}
    for container in await ctx.docker.list_sandboxes(labels):
        info = await ctx.docker.api().containers.container(container).show()
        if SANDBOX_LABEL in (info["Config"].get("Labels") or {}):
            with suppress(SandboxError):
                await ctx.docker.remove_container(container)
    return ended


async def sweep(ctx: WorkerContext) -> list[str]:
    """End the running sandboxes whose worker is gone (twice a heartbeat apart, as the
    reaper checks; the reaper removes their containers), and `starting` ones nobody will
    start any more."""
    by_worker = await rows.active_by_worker(ctx.sessions)
    dead = await leases.missing_twice(
        lambda workers: leases.alive(ctx.redis, workers), by_worker, ctx.settings.worker_heartbeat_s
    )
    ended = []
    for worker in sorted(dead):
        for sandbox_id in by_worker[worker]:
            why = f"infrastructure: its worker {worker} is gone"
            if await rows.end(ctx.sessions, sandbox_id, "worker_lost", why):
                ended.append(sandbox_id)
    wait = timedelta(seconds=ctx.settings.sandbox_create_timeout_s + 30)
    for sandbox_id in await rows.starting_before(ctx.sessions, utc_now() - wait):
        if await rows.end(ctx.sessions, sandbox_id, "failed", "no worker started it"):
            ended.append(sandbox_id)
    if ended:
        log.warning("sandbox sweep ended %d sandboxes: %s", len(ended), ended[:10])
    return ended
