"""The API's side of a sandbox: place it on a worker, then its commands and files over Redis.

Creating picks the least busy live worker that has the image (the rows count each
worker's sandboxes) and asks it over its own list (`app.bus.files`, kind `sandboxes`);
a worker with no free slot answers `full` and the next one is asked. Every later
request goes to the worker the row names. Whatever keeps an answer from coming
becomes a clear error, never a hang: a worker that died ends the sandbox (`worker_lost`,
503), a live one that did not answer in time is a 504. Each command is written to the
sandbox's log once it ends, with the key that ran it.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import time
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus import files as bus
from app.bus import keys
from app.config import Settings
from app.db.engine import Sessions
from app.domain.image_catalogue import DEFAULT as DEFAULT_IMAGE
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
from app.ids import new_command_id, utc_now
from app.schemas.files import FileList, FileWritten
from app.schemas.sandboxes import ExecRequest, ExecResult, SandboxCreate, SandboxOut
from app.services.admin import service as admin
from app.services.sandboxes import service as rows

KIND = "sandboxes"
RETRY_S = 5
GRACE_S = 15.0
"""Past a command's own timeout, how long the API waits for the worker's answer (the kill
of a timed-out command's tree, a slow Docker)."""
_REFUSALS: dict[str, type[AppError]] = {
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
_REASONS = {"is_dir": "is_directory"}
"""The wire's name of a refusal where it differs from the sandbox's."""


@dataclass(frozen=True)
class Held:
    """A running sandbox and the worker holding it."""

    id: str
    tenant: str
    worker: str


async def create(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: SandboxCreate
) -> SandboxOut:
    row = rows.new_row(settings, tenant, body)
    image = row.spec["sandbox"]["image_name"]
    workers = await _candidates(sessions, redis, image)
    if not workers:
        raise Unavailable(
            f"no live worker can start a sandbox of the image {image!r} (start one: sandhive"
            " worker; or build the image there: sandhive image build)",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    await rows.store(sessions, settings, row)
    deadline = time.monotonic() + settings.sandbox_create_timeout_s
    why = "no worker started it in time"
    for worker in workers:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        request = {"op": "create", "sandbox_id": row.id}
        sent = await bus.send(redis, worker, request, timeout_s=left, kind=KIND)
        reply = await bus.wait_reply(redis, sent.reply, timeout_s=left, alive=_alive(redis, worker))
        if reply is None:
            await bus.abandon(redis, sent)
            continue
        if "created" in reply:
            return rows.out(await rows.find(sessions, tenant, row.id))
        if "full" in reply:
            why = "every worker's sandbox slots are taken"
            continue
        why = str(reply.get("failure", reply))
        break
    if not await rows.end(sessions, row.id, "failed", f"could not start: {why}"):
        # Started after all, as the API gave up: the worker's answer was late.
        fresh = await rows.find(sessions, tenant, row.id)
        if fresh.status == "running":
            return rows.out(fresh)
    raise Unavailable(
        f"sandbox {row.id} could not start: {why}",
        RETRY_S,
        details={"sandbox_id": row.id, "error_kind": "infrastructure"},
    )


async def _candidates(sessions: Sessions, redis: Redis, image: str) -> list[str]:
    """Live workers that have the image and are not drained, least busy first (every
    worker runs `default`, as for tasks and episodes, whatever its heartbeat lists yet)."""
    load = await rows.load_per_worker(sessions)
    workers = [
        worker.name
        for worker in await admin.list_workers(redis)
        if not worker.draining and (image == DEFAULT_IMAGE or image in worker.images)
    ]
    return sorted(workers, key=lambda name: (load.get(name, 0), name))


def _alive(redis: Redis, worker: str) -> Any:
    async def alive() -> bool:
        return bool(await redis.exists(keys.worker_heartbeat(worker)))

    return alive


async def held(sessions: Sessions, redis: Redis, tenant: str, sandbox_id: str) -> Held:
    """The running sandbox's worker; 404 (other tenants too), 409 once it ended."""
    row = await rows.find(sessions, tenant, sandbox_id)
    if row.status != "running" or row.worker is None:
        if row.status == "starting":
            raise Conflict(
                f"sandbox {sandbox_id} is still starting", details={"status": "starting"}
            )
        raise rows.ended_conflict(row)
    return Held(row.id, row.tenant_id, row.worker)


async def delete(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str
) -> SandboxOut:
    """End it and remove its container; deleting an ended one changes nothing."""
    row = await rows.find(sessions, tenant, sandbox_id)
    if row.status == "running" and row.worker is not None:
        request = {"op": "delete", "sandbox_id": row.id}
        sent = await bus.send(redis, row.worker, request, timeout_s=GRACE_S, kind=KIND)
        reply = await bus.wait_reply(
            redis, sent.reply, timeout_s=GRACE_S, alive=_alive(redis, row.worker)
        )
        if reply is None:
            await bus.abandon(redis, sent)
    # Its worker answered once it removed the container, or is gone (the reaper removes it).
    await rows.end(sessions, row.id, "deleted")
    return rows.out(await rows.find(sessions, tenant, sandbox_id))


async def extend(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str, ttl_s: int
) -> SandboxOut:
    """Move its deadline; the row is the truth, its worker is told so it need not re-read."""
    row = await rows.extend(sessions, settings, tenant, sandbox_id, ttl_s)
    if row.worker is not None:
        with suppress(RedisError, OSError):
            request = {"op": "ttl", "sandbox_id": row.id, "expires_at": row.expires_at.timestamp()}
            await bus.send(redis, row.worker, request, timeout_s=GRACE_S, kind=KIND)
    return rows.out(row)


@dataclass(frozen=True)
class Command:
    """An exec request as the worker takes it, and what the log keeps of it."""

    request: dict[str, Any]
    logged: dict[str, Any]
    timeout_s: float
    encoding: str


def command(settings: Settings, body: ExecRequest, *, stream: bool) -> Command:
    """The worker's request for `body`: argv (a shell string through `sh -c`), stdin as
    base64, limits within the server's; 413/422 for stdin over the cap or not base64."""
    stdin: bytes | None = None
    if body.stdin is not None:
        if body.stdin_encoding == "base64":
            try:
                stdin = base64.b64decode(body.stdin, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput("stdin: not base64 (stdin_encoding is base64)") from None
        else:
            stdin = body.stdin.encode()
    if stdin is not None and len(stdin) > settings.sandbox_exec_max_stdin_bytes:
        raise TooLarge(
            f"stdin has {len(stdin)} bytes, over SANDHIVE_SANDBOX_EXEC_MAX_STDIN_BYTES="
            f"{settings.sandbox_exec_max_stdin_bytes}"
        )
    argv = body.argv if body.argv is not None else ["sh", "-c", str(body.command)]
    cwd = body.cwd
    if cwd is not None and not cwd.startswith("/"):
        cwd = posixpath.normpath(posixpath.join(settings.sandbox_workdir, cwd))
    cap = settings.sandbox_exec_max_output_bytes
    timeout_s = body.timeout_s if body.timeout_s is not None else settings.sandbox_exec_timeout_s
    request = {
        "op": "exec",
        "argv": argv,
        "cwd": cwd or settings.sandbox_workdir,
        "env": body.env,
        "user": body.user,
        "timeout_s": timeout_s,
        "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
        "max_output": min(body.max_output_bytes or cap, cap),
        "stream": stream,
    }
    logged = {"argv": body.argv, "command": body.command, "user": body.user, "cwd": body.cwd}
    return Command(request, logged, timeout_s, body.output_encoding)


async def exec_command(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    key_id: str | None,
    sandbox_id: str,
    body: ExecRequest,
) -> ExecResult:
    """Run one command to its end (or its timeout) and log it."""
    cmd = command(settings, body, stream=False)
    box = await held(sessions, redis, tenant, sandbox_id)
    started_at, command_id = utc_now(), new_command_id()
    sent = await _send(redis, box, cmd)
    final = await _reply(sessions, redis, box, sent, cmd.timeout_s + GRACE_S)
    return await _ended(sessions, box, cmd, final, key_id, started_at, command_id)


async def exec_stream(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    key_id: str | None,
    sandbox_id: str,
    body: ExecRequest,
) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
    """The command's output as it comes (`("output", {stream, data})`), then
    `("exit", result)`. What is wrong with the request raises at once (the route answers
    it); what goes wrong once it was sent (its worker lost, say) is an `("error", …)` event
    in the contract's error shape, the stream's last."""
    cmd = command(settings, body, stream=True)
    box = await held(sessions, redis, tenant, sandbox_id)
    started_at, command_id = utc_now(), new_command_id()
    sent = await _send(redis, box, cmd)
    return _streamed(sessions, redis, box, cmd, sent, key_id, started_at, command_id)


async def _streamed(
    sessions: Sessions,
    redis: Redis,
    box: Held,
    cmd: Command,
    sent: bus.Sent,
    key_id: str | None,
    started_at: datetime,
    command_id: str,
) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
    deadline = time.monotonic() + cmd.timeout_s + GRACE_S
    finished = False
    try:
        while True:
            left = max(deadline - time.monotonic(), 1.0)
            reply = await _reply(sessions, redis, box, sent, left)
            if "output" not in reply:
                break
            data = _encoded(base64.b64decode(reply["output"]["data"]), cmd.encoding)
            yield "output", {"stream": reply["output"]["stream"], "data": data}
        result = await _ended(sessions, box, cmd, reply, key_id, started_at, command_id)
        finished = True
        yield "exit", result.model_dump(mode="json")
    except AppError as exc:
        finished = True
        yield "error", {"code": exc.code, "message": exc.message, "details": exc.details}
    finally:
        if not finished:
            with suppress(RedisError, OSError):
                await bus.abandon(redis, sent)


async def _send(redis: Redis, box: Held, cmd: Command) -> bus.Sent:
    request = {**cmd.request, "sandbox_id": box.id}
    return await bus.send(redis, box.worker, request, timeout_s=cmd.timeout_s + GRACE_S, kind=KIND)


async def _ended(
    sessions: Sessions,
    box: Held,
    cmd: Command,
    reply: dict[str, Any],
    key_id: str | None,
    started_at: datetime,
    command_id: str,
) -> ExecResult:
    if "exit" not in reply:
        raise SandboxError(f"sandbox {box.id}: the worker answered something unexpected")
    done = reply["exit"]
    result = ExecResult(
        command_id=command_id,
        exit_code=done["exit_code"],
        timed_out=bool(done["timed_out"]),
        stdout=_encoded(base64.b64decode(done.get("stdout", "")), cmd.encoding),
        stderr=_encoded(base64.b64decode(done.get("stderr", "")), cmd.encoding),
        encoding=cmd.encoding,
        stdout_truncated=bool(done["stdout_truncated"]),
        stderr_truncated=bool(done["stderr_truncated"]),
        duration_ms=int(done["duration_ms"]),
    )
    await rows.record_command(
        sessions,
        box.id,
        key_id=key_id,
        request=cmd.logged,
        result=result.model_dump(),
        started_at=started_at,
        command_id=command_id,
    )
    return result


def _encoded(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode()
    return data.decode("utf-8", errors="replace")


async def _reply(
    sessions: Sessions, redis: Redis, box: Held, sent: bus.Sent, timeout_s: float
) -> dict[str, Any]:
    """The worker's next answer to `sent`, or the error it stands for (abandoned then)."""
    alive = _alive(redis, box.worker)
    reply = await bus.wait_reply(redis, sent.reply, timeout_s=timeout_s, alive=alive)
    if reply is None:
        await bus.abandon(redis, sent)
        if not await alive():
            raise await _lost(sessions, box, f"its worker {box.worker} is gone")
        raise WorkerTimeout(
            f"worker {box.worker}, which holds sandbox {box.id}, did not answer in {timeout_s:g} s"
        )
    if "gone" in reply:
        row = await rows.get(sessions, box.id)
        if row is not None and row.status == "ended":
            raise rows.ended_conflict(row)
        raise await _lost(sessions, box, f"its worker {box.worker} no longer holds it")
    if "failure" in reply:
        raise SandboxError(f"sandbox {box.id}: {reply['failure']}")
    if "refused" in reply:
        kind, message = str(reply["refused"]), str(reply.get("message", ""))
        if kind == "timeout":
            raise WorkerTimeout(message)
        details = {"reason": _REASONS.get(kind, kind), "path": reply.get("path")}
        raise _REFUSALS.get(kind, SandboxError)(message, details)
    return reply


async def _lost(sessions: Sessions, box: Held, why: str) -> AppError:
    """End the sandbox as lost (its container goes with its worker); the 503 to raise."""
    await rows.end(sessions, box.id, "worker_lost", f"infrastructure: {why}")
    return Unavailable(
        f"sandbox {box.id} is lost: {why} (an infrastructure failure; make a new one)",
        RETRY_S,
        details={"sandbox_id": box.id, "end_reason": "worker_lost"},
    )


async def list_files(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str, path: str
) -> FileList:
    box = await held(sessions, redis, tenant, sandbox_id)
    reply = await _ask(sessions, redis, settings, box, {"op": "list", "path": path})
    return FileList.model_validate(reply["listing"])


async def write_file(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    sandbox_id: str,
    path: str,
    content: bytes,
) -> FileWritten:
    box = await held(sessions, redis, tenant, sandbox_id)
    request = {"op": "write", "path": path, "content": base64.b64encode(content).decode()}
    reply = await _ask(sessions, redis, settings, box, request)
    return FileWritten.model_validate(reply["written"])


@dataclass(frozen=True)
class OpenedFile:
    size: int
    chunks: AsyncGenerator[bytes, None]


async def read_file(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str, path: str
) -> OpenedFile:
    """The file's size (the worker found it readable), then its bytes as they come."""
    box = await held(sessions, redis, tenant, sandbox_id)
    timeout_s = settings.task_files_timeout_s
    request = {"op": "read", "path": path, "sandbox_id": box.id}
    sent = await bus.send(redis, box.worker, request, timeout_s=timeout_s, kind=KIND)
    head = await _reply(sessions, redis, box, sent, timeout_s)
    size = int(head["file"]["size"])
    return OpenedFile(size, _chunks(sessions, redis, box, sent, size, timeout_s))


async def _chunks(
    sessions: Sessions, redis: Redis, box: Held, sent: bus.Sent, size: int, timeout_s: float
) -> AsyncGenerator[bytes, None]:
    done, finished = 0, False
    try:
        while True:
            reply = await _reply(sessions, redis, box, sent, timeout_s)
            if "chunk" in reply:
                data = base64.b64decode(reply["chunk"])
                done += len(data)
                yield data
            elif "end" in reply and done == size:
                finished = True
                return
            else:
                raise SandboxError(f"the read of a file of sandbox {box.id} broke off: {reply}")
    finally:
        if not finished:
            with suppress(RedisError, OSError):
                await bus.abandon(redis, sent)


async def _ask(
    sessions: Sessions, redis: Redis, settings: Settings, box: Held, request: dict[str, Any]
) -> dict[str, Any]:
    timeout_s = settings.task_files_timeout_s
    body = {**request, "sandbox_id": box.id}
    sent = await bus.send(redis, box.worker, body, timeout_s=timeout_s, kind=KIND)
    return await _reply(sessions, redis, box, sent, timeout_s)
