"""Artifact routes: the list, one file served safely, and a zip of them all.

Files are the agent's output, so they are served as untrusted content: never
sniffed, sandboxed by CSP, and active types (HTML, SVG, XML) only as downloads.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Response
from starlette.convertors import Convertor, register_url_convertor

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.schemas.tasks import ArtifactList, ErrorOut
from app.services.tasks import artifacts


class AnyPathConvertor(Convertor[str]):
    """Starlette's `path`, newlines included: its `.*` stops at one, so a stored name with a
    newline (collected before such names were refused) would be listed but answer 404."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anypath", AnyPathConvertor())

router = APIRouter(prefix="/v1/tasks/{task_id}", tags=["artifacts"])

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 404)}
_UNTRUSTED = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
_BYTES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"*/*": {}},
        "description": "The bytes, as the media type the file was stored with",
    }
}


@router.get(
    "/artifacts",
    response_model=ArtifactList,
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def list_artifacts(task_id: str, res: Res, tenant: Tenant) -> ArtifactList:
    return await artifacts.list_artifacts(res.sessions, tenant, task_id)


# Registered before `/artifacts/{path:anypath}` so that it is never read as a path.
_ZIP: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/zip": {}}, "description": "Every artifact, zipped"}
}


@router.get("/artifacts.zip", response_class=Response, responses={**_ERRORS, **_ZIP})
async def zip_artifacts(task_id: str, res: Res, tenant: Tenant) -> Response:
    """Every artifact of the task in one zip."""
    content = await artifacts.zip_artifacts(res.sessions, tenant, task_id)
    headers = {**_UNTRUSTED, "Content-Disposition": _disposition("attachment", f"{task_id}.zip")}
    return Response(content, media_type="application/zip", headers=headers)


@router.get("/artifacts/{path:anypath}", response_class=Response, responses={**_ERRORS, **_BYTES})
async def read_artifact(task_id: str, path: str, res: Res, tenant: Tenant) -> Response:
    """One file with its stored Content-Type; HTML, SVG and XML only as attachments."""
    meta, content = await artifacts.read_artifact(res.sessions, tenant, task_id, path)
    kind = "attachment" if is_active(meta.content_type) else "inline"
    headers = {
        **_UNTRUSTED,
        "Content-Type": meta.content_type,
        "Content-Disposition": _disposition(kind, path.rsplit("/", 1)[-1]),
    }
    return Response(content, headers=headers)


def is_active(content_type: str) -> bool:
    """Types a browser may render as a document that runs script."""
    base = content_type.split(";", 1)[0].strip().lower()
    return "html" in base or "xml" in base or "svg" in base or "javascript" in base


def _disposition(kind: str, filename: str) -> str:
    # RFC 6266/5987: an ASCII fallback plus the exact UTF-8 name.
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"
