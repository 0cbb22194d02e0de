"""`/v1/sandboxes`: sandboxes a caller drives itself: commands, files, a TTL (docs/sandboxes.md).

Routes parse and call `services.sandboxes`; the container lives in a worker. Bytes read
from a sandbox are hostile, so files are served as artifacts are: octet-stream, never
sniffed, sandboxed by CSP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection

from app.api import streamcap
from app.api.deps import Res, Tenant, presented_key
from app.api.query import known_query_only
from app.errors import TooLarge
from app.schemas.sandboxes import (
    CommandList,
    ExecRequest,
    ExecResult,
    FileList,
    FileWritten,
    SandboxCreate,
    SandboxList,
    SandboxOut,
    TtlRequest,
)
from app.schemas.tasks import ErrorOut
from app.services import keys
from app.services.cursors import CURSOR_PATTERN
from app.services.sandboxes import calls, commands
from app.services.sandboxes import files as sandbox_files
from app.services.sandboxes import service as sandboxes
from app.services.tasks.files import MAX_PATH_CHARS, PATH_PATTERN
from app.services.tasks.filters import METADATA_PREFIX, metadata_filters

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 404, 409, 413, 422, 429, 502, 503, 504, 507)
}
_UNTRUSTED = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
_BYTES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}
}
_BYTES_IN = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_EVENTS: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/event-stream": {}},
        "description": "`output` events ({stream, data}) as the command prints, then one"
        " `exit` event: the command's result (its output already sent); or, when it broke"
        " off once sent (its worker lost), an `error` event ({code, message, details})",
    }
}
_PATH_DOC = "A path in the sandbox; relative ones are below its workdir (/testbed)."
SandboxPath = Annotated[
    str,
    Query(min_length=1, max_length=MAX_PATH_CHARS, pattern=PATH_PATTERN, description=_PATH_DOC),
]
MAX_PAGE = 100
MAX_COMMANDS_PAGE = 200


def caller_key(conn: HTTPConnection) -> str | None:
    """The id of the API key that made the request (the command log's `key_id`): `admin`
    for the operator's key, none while auth is disabled."""
    presented = presented_key(conn)
    if presented is None:
        return None
    return keys.parse_key(presented) or "admin"


Caller = Annotated[str | None, Depends(caller_key)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SandboxOut, responses=_ERRORS)
async def create_sandbox(
    body: SandboxCreate, response: Response, res: Res, tenant: Tenant
) -> SandboxOut:
    """Start a sandbox; answers once it runs (503 when no worker could start it)."""
    made = await calls.create(res.sessions, res.redis, res.settings, tenant, body)
    response.headers["Location"] = f"/v1/sandboxes/{made.id}"
    return made


@router.get(
    "",
    response_model=SandboxList,
    responses=_ERRORS,
    dependencies=[known_query_only(families=(METADATA_PREFIX,))],
)
async def list_sandboxes(
    request: Request,
    res: Res,
    tenant: Tenant,
    status: Literal["starting", "running", "ended"] | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=100, pattern=CURSOR_PATTERN)] = None,
) -> SandboxList:
    """The tenant's sandboxes, newest first; `metadata.<key>=<value>` keeps those labelled so
    (several: all of them)."""
    metadata = dict(metadata_filters(request.query_params.multi_items()))
    return await sandboxes.page(
        res.sessions,
        tenant,
        status=status,
        metadata=metadata,
        limit=limit,
        cursor=cursor,
    )


@router.get("/{sandbox_id}", response_model=SandboxOut, responses=_ERRORS)
async def get_sandbox(sandbox_id: str, res: Res, tenant: Tenant) -> SandboxOut:
    row = await sandboxes.find(res.sessions, tenant, sandbox_id)
    return sandboxes.out(row)


@router.delete("/{sandbox_id}", response_model=SandboxOut, responses=_ERRORS)
async def delete_sandbox(sandbox_id: str, res: Res, tenant: Tenant) -> SandboxOut:
    """Remove it now (its `end_reason` says `deleted`); deleting an ended one changes nothing."""
    return await calls.delete(res.sessions, res.redis, tenant, sandbox_id)


@router.post("/{sandbox_id}/ttl", response_model=SandboxOut, responses=_ERRORS)
async def set_ttl(sandbox_id: str, body: TtlRequest, res: Res, tenant: Tenant) -> SandboxOut:
    """Let it live `ttl_s` seconds from now (shorter or longer), within its lifetime cap."""
    return await calls.extend(res.sessions, res.settings, tenant, sandbox_id, body.ttl_s)


@router.post("/{sandbox_id}/exec", response_model=ExecResult, responses=_ERRORS)
async def exec_command(
    sandbox_id: str, body: ExecRequest, res: Res, tenant: Tenant, key: Caller
) -> ExecResult:
    """Run one command to its end (or its timeout: everything it started is killed)."""
    return await commands.run(res.sessions, res.redis, res.settings, tenant, key, sandbox_id, body)


@router.post(
    "/{sandbox_id}/exec/stream",
    response_class=StreamingResponse,
    responses={**_ERRORS, **_EVENTS},
)
async def exec_stream(
    sandbox_id: str, body: ExecRequest, res: Res, tenant: Tenant, key: Caller
) -> Response:
    """Run one command, its output sent as it comes (Server-Sent Events); it holds one of
    the tenant's `SANDHIVE_STREAM_MAX_PER_TENANT` stream slots while it runs (429 past)."""
    slot = await streamcap.take_slot(res, tenant)  # 429 + Retry-After past the tenant's cap
    try:
        events = await commands.stream(
            res.sessions, res.redis, res.settings, tenant, key, sandbox_id, body
        )
    except BaseException:
        await slot.give_back()
        raise

    async def sse() -> AsyncIterator[bytes]:
        async for name, data in events:
            if data is None:  # silent for a while: a comment keeps proxies from cutting it
                yield b": keepalive\n\n"
            else:
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    response = StreamingResponse(sse(), media_type="text/event-stream", headers=headers)
    return streamcap.HoldingSlot(response, slot)


@router.get(
    "/{sandbox_id}/commands",
    response_model=CommandList,
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def list_commands(
    sandbox_id: str,
    res: Res,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=MAX_COMMANDS_PAGE)] = 100,
    cursor: Annotated[str | None, Query(max_length=9, pattern=r"^[0-9]{1,9}$")] = None,
) -> CommandList:
    """Who ran what in it, in order (the audit log); pass `next_cursor` back as `cursor`."""
    after = int(cursor) if cursor is not None else 0
    return await sandboxes.commands(res.sessions, tenant, sandbox_id, limit=limit, after=after)


@router.get(
    "/{sandbox_id}/files/list",
    response_model=FileList,
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def list_files(
    sandbox_id: str,
    res: Res,
    tenant: Tenant,
    path: Annotated[
        str, Query(max_length=MAX_PATH_CHARS, pattern=PATH_PATTERN, description=_PATH_DOC)
    ] = ".",
) -> FileList:
    """A directory of the sandbox (its workdir by default)."""
    return await sandbox_files.list_dir(
        res.sessions, res.redis, res.settings, tenant, sandbox_id, path
    )


@router.get(
    "/{sandbox_id}/files",
    response_class=Response,
    responses={**_ERRORS, **_BYTES},
    dependencies=[known_query_only()],
)
async def read_file(sandbox_id: str, path: SandboxPath, res: Res, tenant: Tenant) -> Response:
    """One file, streamed: 404 `missing`, 422 `is_directory`, 403 `forbidden`, 413
    `too_large` (over `SANDHIVE_SANDBOX_FILES_MAX_BYTES`) in `details.reason`."""
    opened = await sandbox_files.read(
        res.sessions, res.redis, res.settings, tenant, sandbox_id, path
    )
    headers = {**_UNTRUSTED, "Content-Length": str(opened.size)}
    return StreamingResponse(opened.chunks, media_type="application/octet-stream", headers=headers)


@router.put(
    "/{sandbox_id}/files",
    response_model=FileWritten,
    responses=_ERRORS,
    dependencies=[known_query_only()],
    openapi_extra={"requestBody": {"required": True, "content": _BYTES_IN}},
)
async def write_file(
    sandbox_id: str, path: SandboxPath, request: Request, res: Res, tenant: Tenant
) -> FileWritten:
    """Write the body as the file (parents made, replaced atomically)."""
    content = await request.body()
    cap = res.settings.sandbox_files_max_bytes
    if len(content) > cap:
        raise TooLarge(
            f"the file has {len(content)} bytes, over SANDHIVE_SANDBOX_FILES_MAX_BYTES={cap}",
            details={"reason": "too_large", "path": path},
        )
    return await sandbox_files.write(
        res.sessions, res.redis, res.settings, tenant, sandbox_id, path, content
    )
