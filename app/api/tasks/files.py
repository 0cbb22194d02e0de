"""Files of a running task: list a directory, read a file (streamed), write one.

The API never touches the sandbox: `app.services.tasks.files` forwards each request to the
worker holding it. Read bytes are the agent's, so they are served like artifacts: as
octet-stream, never sniffed, sandboxed by CSP, as an attachment.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.api.tasks.artifacts import _disposition  # its import registers the `anypath` convertor
from app.errors import TooLarge
from app.schemas.files import FileList, FileWritten
from app.schemas.tasks import ErrorOut
from app.services.tasks import files as task_files
from app.services.tasks.files import MAX_PATH_CHARS, PATH_PATTERN

router = APIRouter(prefix="/v1/tasks/{task_id}", tags=["files"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 404, 409, 413, 422, 502, 503, 504, 507)
}
_UNTRUSTED = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
_BYTES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}
}
_BYTES_IN = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_PATH_DOC = (
    "A path in the sandbox: relative ones are below the workdir (/testbed); absolute ones"
    " must lie in its writable area (the workdir, /tmp, /var/tmp, /root, /run)."
)


SandboxPath = Annotated[
    str, Path(max_length=MAX_PATH_CHARS, pattern=PATH_PATTERN, description=_PATH_DOC)
]


@router.get("/files", response_model=FileList, responses=_ERRORS, dependencies=[known_query_only()])
async def list_files(
    task_id: str,
    res: Res,
    tenant: Tenant,
    path: str = Query(
        default="", max_length=MAX_PATH_CHARS, pattern=PATH_PATTERN, description=_PATH_DOC
    ),
) -> FileList:
    """A directory of the running task's sandbox (the workdir when `path` is empty)."""
    clean = task_files.clean_path(path, allow_root=True)
    return await task_files.list_files(
        res.sessions, res.redis, res.settings, tenant, task_id, clean
    )


@router.get(
    "/files/{path:anypath}",
    response_class=Response,
    responses={**_ERRORS, **_BYTES},
    dependencies=[known_query_only()],
)
async def read_file(task_id: str, path: SandboxPath, res: Res, tenant: Tenant) -> Response:
    """One file of the running task's sandbox, streamed; 413 over `task_files_max_read_bytes`."""
    clean = task_files.clean_path(path)
    opened = await task_files.read_file(
        res.sessions, res.redis, res.settings, tenant, task_id, clean
    )
    headers = {
        **_UNTRUSTED,
        "Content-Length": str(opened.size),
        "Content-Disposition": _disposition("attachment", clean.rsplit("/", 1)[-1]),
    }
    return StreamingResponse(opened.chunks, media_type="application/octet-stream", headers=headers)


@router.put(
    "/files/{path:anypath}",
    response_model=FileWritten,
    responses=_ERRORS,
    dependencies=[known_query_only()],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": _BYTES_IN,
        }
    },
)
async def write_file(
    task_id: str, path: SandboxPath, request: Request, res: Res, tenant: Tenant
) -> FileWritten:
    """Write the body as the file (parents made, replaced atomically) in the running sandbox;
    413 over `task_files_max_write_bytes`."""
    clean = task_files.clean_path(path)
    content = await request.body()
    cap = res.settings.task_files_max_write_bytes
    if len(content) > cap:
        raise TooLarge(f"the file is over the {cap}-byte cap of a write")
    return await task_files.write_file(
        res.sessions, res.redis, res.settings, tenant, task_id, clean, content
    )
