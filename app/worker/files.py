"""The worker's file service: list, read and write files of the tasks it runs, in their sandbox.

Requests come from this worker's own list (`app.bus.files`), each answered on its reply
key: an error kind the API maps to a status, or the answer (a read streams its chunks).
A request for a task this worker does not run (any more), or for an attempt other than
the running one, is answered `gone`; before its sandbox is ready, `starting`. The
sandbox is the attempt's own (`Running.sandbox`), so a file request runs beside the
agent's commands over the same exec channel.

It serves until the pool halts it, not when the worker starts stopping: tasks keep running
through the shutdown grace or an operator's drain, and their files with them. Each request
is a `python3` in the sandbox, so at most `task_files_max_concurrent_per_task` run per task
and `task_files_max_concurrent_per_worker` per worker; the rest wait, and are dropped once
their caller has stopped waiting. A read sends at most `READ_AHEAD` chunks more than its
reader has taken.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import Counter, defaultdict
from contextlib import suppress
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from app.bus import files as bus
from app.errors import SandboxError
from app.sandbox import task_files
from app.sandbox.docker import DockerSandbox
from app.sandbox.task_files import FileRefused
from app.schemas.files import FileList, FileWritten
from app.worker.context import WorkerContext
from app.worker.running import Running

log = logging.getLogger(__name__)
BLOCK_S = 0.2
PAUSE_S = 1.0
READ_AHEAD = 16
"""Chunks (64 KiB each) of a read waiting in Redis for their reader, at most: a reader that
stops taking them stalls the read (its exec times out), not Redis's memory."""
Reply = dict[str, Any]


class FileServer:
    def __init__(self, ctx: WorkerContext, running: dict[str, Running]) -> None:
        self.ctx, self.running = ctx, running
        self.halted = asyncio.Event()
        s = ctx.settings
        self._per_worker = asyncio.Semaphore(s.task_files_max_concurrent_per_worker)
        per_task = s.task_files_max_concurrent_per_task
        self._per_task: defaultdict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(per_task)
        )
        self._users: Counter[str] = Counter()
        """Requests holding or awaiting each task's semaphore (dropped at zero)."""

    def halt(self) -> None:
        self.halted.set()

    async def serve(self) -> None:
        """Until the pool halts it (its tasks have ended); requests in flight finish."""
        async with asyncio.TaskGroup() as group:
            while not self.halted.is_set():
                try:
                    request = await bus.next_request(
                        self.ctx.redis, self.ctx.name, timeout_s=BLOCK_S
                    )
                except (RedisError, OSError) as exc:
                    log.warning("files: lost touch with Redis: %r", exc)
                    await asyncio.sleep(PAUSE_S)
                    continue
                if request is not None and not await self._expired(request):
                    group.create_task(self._handle(request))

    async def _expired(self, request: dict[str, Any]) -> bool:
        """Whether its caller stopped waiting; not known (Redis unreachable for its clock):
        served, as before deadlines were read on Redis's clock. Never raises, so a Redis
        blip cannot end the file server."""
        try:
            return await bus.expired(self.ctx.redis, request)
        except (RedisError, OSError):
            return False

    async def _handle(self, request: dict[str, Any]) -> None:
        task_id = str(request.get("task_id"))
        self._users[task_id] += 1
        try:
            async with self._per_task[task_id], self._per_worker:
                if await self._expired(request):
                    return  # it waited its turn past its caller's patience
                await self._answer(request)
        finally:
            self._users[task_id] -= 1
            if not self._users[task_id]:
                del self._users[task_id], self._per_task[task_id]

    async def _answer(self, request: dict[str, Any]) -> None:
        reply = str(request.get("reply", ""))
        try:
            final = await self._serve(request, reply)
        except Exception as exc:
            log.exception("file request on %s failed", request.get("task_id"))
            final = {"failure": f"the worker failed: {type(exc).__name__}"}
        # A caller that gave up took its reply key away; answering would leave one behind.
        # (A read's last answer comes after chunks its reader is taking: always sent.)
        with suppress(RedisError, OSError):
            if final is not None and (
                request.get("op") == "read" or not await self._expired(request)
            ):
                await bus.answer(self.ctx.redis, reply, final)

    async def _serve(self, request: dict[str, Any], reply: str) -> Reply | None:
        """The last (or only) answer; None when a read already sent it."""
        box, why = self._sandbox(request)
        if box is None:
            return why
        s, op, path = self.ctx.settings, request.get("op"), str(request.get("path", ""))
        timeout_s = s.task_files_timeout_s
        try:
            if op == "list":
                listing = await task_files.list_dir(
                    box, path or ".", max_entries=s.task_files_max_entries, timeout_s=timeout_s
                )
                return {"listing": FileList.model_validate(listing).model_dump()}
            if op == "read":
                return await self._read(box, path, reply)
            if op == "write":
                content = base64.b64decode(str(request.get("content", "")), validate=True)
                written = await task_files.write_file(
                    box, path, content, max_bytes=s.task_files_max_write_bytes, timeout_s=timeout_s
                )
                return {"written": FileWritten.model_validate(written).model_dump()}
        except FileRefused as refused:
            return {"refused": refused.kind, "message": refused.message}
        except ValidationError:
            return {"refused": "failure", "message": "the sandbox answered something unreadable"}
        except SandboxError as exc:
            if self._sandbox(request)[0] is not box:  # the task ended while we asked
                return {"gone": "the task ended while its file was being accessed"}
            return {"refused": "failure", "message": exc.message}
        return {"refused": "failure", "message": f"unknown operation {op!r}"}

    async def _read(self, box: DockerSandbox, path: str, reply: str) -> Reply | None:
        redis = self.ctx.redis
        started = stalled = False

        async def header(head: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await bus.answer(redis, reply, {"file": {"size": head["size"]}})

        async def chunk(data: bytes) -> None:
            nonlocal stalled
            timeout_s = self.ctx.settings.task_files_timeout_s
            if stalled or not await bus.room_for(
                redis, reply, ahead=READ_AHEAD, timeout_s=timeout_s
            ):
                stalled = True  # the rest is dropped: nobody takes it
                return
            await bus.answer(redis, reply, {"chunk": base64.b64encode(data).decode()})

        try:
            sent = await task_files.read_file(
                box,
                path,
                max_bytes=self.ctx.settings.task_files_max_read_bytes,
                timeout_s=self.ctx.settings.task_files_timeout_s,
                on_header=header,
                on_chunk=chunk,
            )
        except (FileRefused, SandboxError) as exc:
            if not started:
                raise
            message = exc.message
            return {"abort": message}
        if stalled:
            return {"abort": "the reader stopped taking the file's chunks"}
        return {"end": sent}

    def _sandbox(self, request: dict[str, Any]) -> tuple[DockerSandbox | None, Reply]:
        """The running attempt's sandbox the request names, or why there is none."""
        running = self.running.get(str(request.get("task_id")))
        if running is None or running.attempt != request.get("attempt"):
            return None, {"gone": "this worker no longer runs that attempt of the task"}
        if running.sandbox is None:
            return None, {"starting": "the task's sandbox is not ready (starting or ending)"}
        return running.sandbox, {}
