"""The API's side of a running task's files: find the worker holding it, ask over Redis.

The task row says whether it runs (tenant-scoped: another tenant's task is not found);
its lease says which worker holds the sandbox. The path is checked lexically here (the
sandbox does the real check, with its own view of links); whatever keeps an answer
from coming becomes a 503 (no worker holds it, or its worker died) or a 504 (a live
worker did not answer in time).
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus import files as bus
from app.bus import keys
from app.bus.leases import worker_of
from app.config import Settings
from app.db.engine import Sessions
from app.errors import (
    AppError,
    Conflict,
    Forbidden,
    InsufficientStorage,
    InvalidInput,
    NotFound,
    SandboxError,
    TooLarge,
    Unavailable,
    WorkerTimeout,
)
from app.schemas.files import FileList, FileWritten
from app.services.visibility import find_task
from app.states import TaskStatus

RETRY_S = 2
MAX_PATH_CHARS = 4096
PATH_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
"""What a sandbox path may hold: no control character (C0, DEL, C1). The API's parameters
carry it, so the OpenAPI document admits exactly the paths `clean_path` takes."""
_UNUSABLE = re.compile("[\x00-\x1f\x7f-\x9f]")
REFUSALS: dict[str, type[AppError]] = {
    "outside": InvalidInput,
    "not_file": InvalidInput,
    "is_dir": InvalidInput,
    "not_dir": InvalidInput,
    "missing": NotFound,
    "too_large": TooLarge,
    "no_space": InsufficientStorage,
    "forbidden": Forbidden,
    "os": Conflict,
}


@dataclass(frozen=True)
class Holder:
    """The worker running the task's current attempt."""

    task_id: str
    attempt: int
    worker: str


def clean_path(raw: str, *, allow_root: bool = False) -> str:
    """The request's path, normalised ("a/./b" is "a/b"); 422 for `..`, control characters,
    or an empty one (unless `allow_root`: the workdir itself, for a listing)."""
    if len(raw) > MAX_PATH_CHARS or _UNUSABLE.search(raw):
        raise InvalidInput("the path must be printable and at most 4096 characters")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"the path {raw!r} must not contain '..'")
    if not parts and not allow_root:
        raise InvalidInput("the path must name a file")
    joined = "/".join(parts)
    return "/" + joined if raw.startswith("/") else joined


async def holder(sessions: Sessions, redis: Redis, tenant: str, task_id: str) -> Holder:
    """Who holds the running task's sandbox; 404 (other tenants too), 409 unless running."""
    async with sessions() as session:
        task = await find_task(session, tenant, task_id)
    artifacts = f"/v1/tasks/{task_id}/artifacts"
    if task.status == TaskStatus.queued:
        raise Conflict(
            f"task {task_id} is queued: its files can be read and written once it runs",
            details={"status": task.status},
        )
    if task.status != TaskStatus.running:
        raise Conflict(
            f"task {task_id} is {task.status}: its sandbox is gone; the files it left are"
            f" its artifacts: GET {artifacts}",
            details={"status": task.status, "artifacts": artifacts},
        )
    lease: Any = await redis.get(keys.task_lease(task_id))
    if lease is None:
        raise Unavailable(
            f"no worker holds task {task_id} right now (between attempts); retry shortly",
            RETRY_S,
        )
    text = lease.decode() if isinstance(lease, bytes) else str(lease)
    return Holder(task_id, task.attempt, worker_of(text))


async def list_files(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, task_id: str, path: str
) -> FileList:
    held = await holder(sessions, redis, tenant, task_id)
    reply = await _ask(redis, settings, held, {"op": "list", "path": path})
    return FileList.model_validate(reply["listing"])


async def write_file(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    task_id: str,
    path: str,
    content: bytes,
) -> FileWritten:
    held = await holder(sessions, redis, tenant, task_id)
    request = {"op": "write", "path": path, "content": base64.b64encode(content).decode()}
    reply = await _ask(redis, settings, held, request)
    return FileWritten.model_validate(reply["written"])


@dataclass(frozen=True)
class OpenedFile:
    size: int
    chunks: AsyncGenerator[bytes, None]


async def read_file(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, task_id: str, path: str
) -> OpenedFile:
    """The file's size (the worker found it readable), then its bytes as they come."""
    held = await holder(sessions, redis, tenant, task_id)
    sent = await bus.send(redis, held.worker, _request(held, "read", path), **_wait(settings))
    head = await _reply(redis, settings, held, sent)
    size = int(head["file"]["size"])
    return OpenedFile(size, _chunks(redis, settings, held, sent, size))


async def _chunks(
    redis: Redis, settings: Settings, held: Holder, sent: bus.Sent, size: int
) -> AsyncGenerator[bytes, None]:
    """The chunks up to the end; a failure part way raises (the client sees a short body).

    A client that goes away part way closes this generator: the chunks already answered are
    dropped with the reply key (the worker, finding no reader, stops sending)."""
    done = 0
    finished = False
    try:
        while True:
            reply = await _reply(redis, settings, held, sent)
            if "chunk" in reply:
                data = base64.b64decode(reply["chunk"])
                done += len(data)
                yield data
            elif "end" in reply and done == size:
                finished = True
                return
            else:
                raise SandboxError(f"the read of a file of task {held.task_id} broke off: {reply}")
    finally:
        if not finished:
            with suppress(RedisError, OSError):
                await bus.abandon(redis, sent)


def _request(held: Holder, op: str, path: str) -> dict[str, Any]:
    return {"op": op, "task_id": held.task_id, "attempt": held.attempt, "path": path}


def _wait(settings: Settings) -> dict[str, Any]:
    return {"timeout_s": settings.task_files_timeout_s}


async def _ask(
    redis: Redis, settings: Settings, held: Holder, request: dict[str, Any]
) -> dict[str, Any]:
    body = {**_request(held, str(request["op"]), str(request["path"])), **request}
    sent = await bus.send(redis, held.worker, body, **_wait(settings))
    return await _reply(redis, settings, held, sent)


async def _reply(redis: Redis, settings: Settings, held: Holder, sent: bus.Sent) -> dict[str, Any]:
    """The next reply to `sent`, or the error it stands for (the request abandoned)."""

    async def alive() -> bool:
        return bool(await redis.exists(keys.worker_heartbeat(held.worker)))

    reply = await bus.wait_reply(
        redis, sent.reply, timeout_s=settings.task_files_timeout_s, alive=alive
    )
    if reply is None:
        await bus.abandon(redis, sent)
        if not await alive():
            raise Unavailable(
                f"worker {held.worker}, which runs task {held.task_id}, stopped answering;"
                " the task will run again elsewhere: retry shortly",
                RETRY_S,
            )
        raise WorkerTimeout(
            f"worker {held.worker} did not answer within {settings.task_files_timeout_s:g} s"
            " (a write may still land)"
        )
    _raise_refusal(reply, held)
    return reply


def _raise_refusal(reply: dict[str, Any], held: Holder) -> None:
    if "gone" in reply:
        raise Conflict(
            f"task {held.task_id} is no longer running on its worker: {reply['gone']}",
            details={"artifacts": f"/v1/tasks/{held.task_id}/artifacts"},
        )
    if "starting" in reply:
        raise Unavailable(str(reply["starting"]), RETRY_S)
    if "failure" in reply:
        raise SandboxError(str(reply["failure"]))
    if "refused" in reply:
        kind, message = str(reply["refused"]), str(reply.get("message", ""))
        if kind == "timeout":
            raise WorkerTimeout(message)
        # A directory is `not_file` on this API's wire, as before the sandbox told it apart.
        reason = "not_file" if kind == "is_dir" else kind
        raise REFUSALS.get(kind, SandboxError)(message, {"reason": reason})
