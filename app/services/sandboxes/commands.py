"""A sandbox's commands, from the API: run one (its result, or its output as it comes) and
keep its command log.

Each command enters the log as it is sent (who, what, where), and gets its outcome when it
ends; a command whose answer never came (its caller went away, its worker was lost) keeps
no outcome, so nothing runs unrecorded. The log keeps what was asked up to
`LOG_MAX_CHARS` (then `truncated`): a command may be a megabyte, its log entry may not.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import time
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus import files as bus
from app.config import Settings
from app.db.engine import Sessions
from app.errors import AppError, InvalidInput, SandboxError, TooLarge
from app.ids import new_command_id
from app.schemas.sandboxes import ExecRequest, ExecResult
from app.services.sandboxes import calls
from app.services.sandboxes import service as rows

GRACE_S = 15.0
"""Past a command's own timeout, how long the API waits for the worker's answer (the kill
of a timed-out command's tree, a slow Docker)."""
KEEPALIVE_S = 15.0
"""A streamed command silent this long gets an SSE comment, so proxies keep the stream."""
LOG_MAX_CHARS = 8192


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
    return Command(request, logged(body), timeout_s, body.output_encoding)


def logged(body: ExecRequest) -> dict[str, Any]:
    """What the log keeps of a command: as asked, up to `LOG_MAX_CHARS` of argv or line."""
    truncated = False
    argv: list[str] | None = None
    if body.argv is not None:
        argv, used = [], 0
        for arg in body.argv:
            room = LOG_MAX_CHARS - used
            if len(arg) > room:
                argv.append(arg[:room])
                truncated = True
                break
            argv.append(arg)
            used += len(arg)
    line = body.command
    if line is not None and len(line) > LOG_MAX_CHARS:
        line, truncated = line[:LOG_MAX_CHARS], True
    return {
        "argv": argv,
        "command": line,
        "user": body.user,
        "cwd": body.cwd,
        "truncated": truncated,
    }


async def run(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    key_id: str | None,
    sandbox_id: str,
    body: ExecRequest,
    *,
    urgent: bool = False,
) -> ExecResult:
    """Run one command to its end (or its timeout). `urgent`: the worker runs it without
    waiting for the sandbox's turn (a signal must not queue behind the commands it ends)."""
    cmd = command(settings, body, stream=False)
    if urgent:
        cmd.request["urgent"] = True
    box = await calls.held(sessions, tenant, sandbox_id)
    command_id = await _sent(sessions, box, cmd, key_id)
    sent = await calls.send(redis, box, cmd.request, cmd.timeout_s + GRACE_S)
    final = await calls.reply(sessions, redis, settings, box, sent, cmd.timeout_s + GRACE_S)
    return await _ended(sessions, cmd, final, command_id)


async def stream(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    key_id: str | None,
    sandbox_id: str,
    body: ExecRequest,
) -> AsyncGenerator[tuple[str, dict[str, Any] | None], None]:
    """The command's output as it comes (`("output", {stream, data})`), then
    `("exit", result)`; `("keepalive", None)` while it is silent. What is wrong with the
    request raises at once (the route answers it); what goes wrong once it was sent (its
    worker lost, say) is an `("error", …)` event in the contract's error shape, the last."""
    cmd = command(settings, body, stream=True)
    box = await calls.held(sessions, tenant, sandbox_id)
    command_id = await _sent(sessions, box, cmd, key_id)
    sent = await calls.send(redis, box, cmd.request, cmd.timeout_s + GRACE_S)
    return _streamed(sessions, redis, settings, box, cmd, sent, command_id)


async def _streamed(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    box: calls.Held,
    cmd: Command,
    sent: bus.Sent,
    command_id: str,
) -> AsyncGenerator[tuple[str, dict[str, Any] | None], None]:
    deadline = time.monotonic() + cmd.timeout_s + GRACE_S
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                await calls.reply(sessions, redis, settings, box, sent, 0.01)  # the 504
            slice_s = min(left, KEEPALIVE_S)
            reply = await calls.wait(sessions, redis, settings, box, sent, max(slice_s, 0.01))
            if reply is None:
                yield "keepalive", None
                continue
            if "output" not in reply:
                break
            data = _encoded(base64.b64decode(reply["output"]["data"]), cmd.encoding)
            yield "output", {"stream": reply["output"]["stream"], "data": data}
        result = await _ended(sessions, cmd, reply, command_id)
        finished = True
        yield "exit", result.model_dump(mode="json")
    except AppError as exc:
        finished = True
        yield "error", {"code": exc.code, "message": exc.message, "details": exc.details}
    finally:
        if not finished:
            with suppress(RedisError, OSError):
                await bus.abandon(redis, sent)


async def _sent(sessions: Sessions, box: calls.Held, cmd: Command, key_id: str | None) -> str:
    """Log the command as sent; its id."""
    command_id = new_command_id()
    await rows.log_sent(sessions, box.id, command_id, key_id=key_id, logged=cmd.logged)
    return command_id


async def _ended(
    sessions: Sessions, cmd: Command, reply: dict[str, Any], command_id: str
) -> ExecResult:
    if "exit" not in reply:
        raise SandboxError("the worker answered something unexpected")
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
    await rows.log_ended(
        sessions,
        command_id,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration_ms=result.duration_ms,
    )
    return result


def _encoded(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode()
    return data.decode("utf-8", errors="replace")
