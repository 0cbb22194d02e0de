"""A sandbox's files, from the API: list a directory, read a file (streamed), write one.

The worker holding the sandbox runs each request in it (`app.sandbox.task_files`, anywhere
in its filesystem, as the sandbox sees it); a read comes back as its size, then its chunks.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus import files as bus
from app.config import Settings
from app.db.engine import Sessions
from app.errors import SandboxError
from app.schemas.files import FileList, FileWritten
from app.services.sandboxes import calls


@dataclass(frozen=True)
class OpenedFile:
    size: int
    chunks: AsyncGenerator[bytes, None]


async def list_dir(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str, path: str
) -> FileList:
    reply = await _ask(sessions, redis, settings, tenant, sandbox_id, {"op": "list", "path": path})
    return FileList.model_validate(reply["listing"])


async def write(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    sandbox_id: str,
    path: str,
    content: bytes,
) -> FileWritten:
    request = {"op": "write", "path": path, "content": base64.b64encode(content).decode()}
    reply = await _ask(sessions, redis, settings, tenant, sandbox_id, request)
    return FileWritten.model_validate(reply["written"])


async def read(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, sandbox_id: str, path: str
) -> OpenedFile:
    """The file's size (the worker found it readable), then its bytes as they come."""
    box = await calls.held(sessions, tenant, sandbox_id)
    timeout_s = settings.task_files_timeout_s
    sent = await calls.send(redis, box, {"op": "read", "path": path}, timeout_s)
    head = await calls.reply(sessions, redis, settings, box, sent, timeout_s)
    size = int(head["file"]["size"])
    return OpenedFile(size, _chunks(sessions, redis, settings, box, sent, size))


async def _chunks(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    box: calls.Held,
    sent: bus.Sent,
    size: int,
) -> AsyncGenerator[bytes, None]:
    """The chunks up to the end; a failure part way raises (the client sees a short body)."""
    done, finished = 0, False
    try:
        while True:
            reply = await calls.reply(
                sessions, redis, settings, box, sent, settings.task_files_timeout_s
            )
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
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    sandbox_id: str,
    request: dict[str, Any],
) -> dict[str, Any]:
    box = await calls.held(sessions, tenant, sandbox_id)
    timeout_s = settings.task_files_timeout_s
    sent = await calls.send(redis, box, request, timeout_s)
    return await calls.reply(sessions, redis, settings, box, sent, timeout_s)
