"""E2B's control plane under `/e2b` (what the SDK calls at `E2B_API_URL`): sandboxes made,
listed, read, given a new timeout, connected to and killed, as `/v1/sandboxes` does them.

A template is a catalogue image by name (`base`, E2B's default, is the `default` image
where the catalogue has no `base`), or one of the tenant's own (`built/NAME`); the
timeout is the sandbox's TTL. What Sandhive has no counterpart for (pause and resume,
snapshots, forks, volumes, template builds, auto-pause, MCP, per-sandbox network rules) is
a 501 saying so, never a hang or a 500.
"""

from __future__ import annotations

import urllib.parse
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError

from app.api.deps import Res
from app.api.e2b.auth import e2b_errors, e2b_key, e2b_tenant, error
from app.domain.image_catalogue import catalogue
from app.errors import InvalidInput, NotFound
from app.schemas.sandboxes import SandboxCreate, SandboxOut
from app.schemas.tasks import WireModel
from app.services.sandboxes import calls
from app.services.sandboxes import service as sandboxes

router = APIRouter(tags=["e2b"], include_in_schema=False)
"""Mounted at `/e2b` (`app.api.app.LazyE2B`)."""

ENVD_VERSION = "0.5.2"
"""The envd version sandboxes report: the SDK then uses what this server serves (users by
name, stdin sent and closed later, multipart uploads: octet-stream ones come at 0.5.7)."""
DEFAULT_TEMPLATE = "base"
CLIENT_ID = "sandhive"
MAX_LIST = 100
UNSUPPORTED = {
    "autoPause": "auto-pause",
    "mcp": "MCP servers in the sandbox",
    "volumeMounts": "volumes",
    "iam": "IAM roles",
    "network": "per-sandbox network rules",
}


class NewSandbox(WireModel):
    """E2B's `NewSandbox` body, the fields this server reads (the others are refused
    when set: `UNSUPPORTED`)."""

    templateID: str = Field(min_length=1, max_length=200)
    """The template: a catalogue image, or `built/NAME`."""
    timeout: int = Field(default=15, ge=1)
    """Seconds it lives (its TTL)."""
    metadata: dict[str, str] | None = None
    """Labels, filtered on by the list."""
    envVars: dict[str, str] | None = None
    """Variables every command sees."""
    allow_internet_access: bool | None = None
    """True asks for outbound network (`egress`, where the server enables it)."""


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
@e2b_errors
async def create(request: Request, res: Res) -> Response:
    tenant = await e2b_tenant(request, res)
    body = await _json(request)
    for name, what in UNSUPPORTED.items():
        if body.get(name) not in (None, False, {}, []):
            return error(501, f"{what} ({name}) is not supported by this server")
    try:
        asked = NewSandbox.model_validate(body)
    except ValidationError as exc:
        return error(400, f"invalid sandbox request: {exc.errors()[0]['msg']}")
    network: Literal["none", "egress"] = "none"
    if asked.allow_internet_access:
        if not res.settings.sandbox_egress_enabled:
            return error(400, "internet access is not enabled on this server")
        network = "egress"
    try:
        wanted = SandboxCreate(
            image=_image(asked.templateID, _catalogue(res)),
            ttl_s=asked.timeout,
            metadata=asked.metadata or {},
            env=asked.envVars or {},
            network=network,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return error(400, f"invalid sandbox request: {where}: {first['msg']}")
    try:
        made = await calls.create(res.sessions, res.redis, res.settings, tenant, wanted)
    except InvalidInput as exc:
        if any(d.get("type") == "unknown_image" for d in _details(exc)):
            return error(404, f"template '{asked.templateID}' not found")
        raise
    return JSONResponse(_sandbox(made, asked.templateID, e2b_key(request)), status_code=201)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
@e2b_errors
async def list_sandboxes(
    request: Request,
    res: Res,
    metadata: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
    nextToken: str | None = None,
) -> Response:
    """Running sandboxes (there are no paused ones here), newest first; `metadata` is
    `k=v&k2=v2` URL-encoded, each key and value quoted once more, as the SDK sends it."""
    tenant = await e2b_tenant(request, res)
    for name in ("template", "startedAfter", "order"):
        if request.query_params.get(name):
            return error(501, f"listing by {name} is not supported by this server")
    states = set((state or "running").split(","))
    wanted = {
        urllib.parse.unquote(key): urllib.parse.unquote(value)
        for key, value in urllib.parse.parse_qsl(metadata or "", keep_blank_values=True)
    }
    if "running" not in states:
        return JSONResponse([])
    page = await sandboxes.page(
        res.sessions, tenant, status="running", metadata=wanted, limit=limit, cursor=nextToken
    )
    headers = {"x-next-token": page.next_cursor} if page.next_cursor else None
    return JSONResponse([_listed(box) for box in page.items], headers=headers)


@router.get("/sandboxes/{sandbox_id}")
@e2b_errors
async def get_sandbox(sandbox_id: str, request: Request, res: Res) -> Response:
    box = await _running(request, res, sandbox_id)
    return JSONResponse({**_listed(box), "envdAccessToken": e2b_key(request), "domain": None})


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
@e2b_errors
async def set_timeout(sandbox_id: str, request: Request, res: Res) -> Response:
    tenant = await e2b_tenant(request, res)
    seconds = _seconds((await _json(request)).get("timeout"))
    await _running(request, res, sandbox_id, tenant)
    await calls.extend(res.sessions, res.settings, tenant, sandbox_id, seconds)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
@e2b_errors
async def connect(sandbox_id: str, request: Request, res: Res) -> Response:
    """A running sandbox, its TTL set to `timeout` when that is later than its deadline."""
    tenant = await e2b_tenant(request, res)
    asked = (await _json(request)).get("timeout")
    box = await _running(request, res, sandbox_id, tenant)
    if asked is not None:
        seconds = _seconds(asked)
        left = (box.expires_at - datetime.now(box.expires_at.tzinfo)).total_seconds()
        if seconds > left:
            box = await calls.extend(res.sessions, res.settings, tenant, sandbox_id, seconds)
    return JSONResponse(_sandbox(box, box.image, e2b_key(request)))


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
@e2b_errors
async def kill(sandbox_id: str, request: Request, res: Res) -> Response:
    tenant = await e2b_tenant(request, res)
    await _running(request, res, sandbox_id, tenant)
    await calls.delete(res.sessions, res.redis, tenant, sandbox_id)
    return Response(status_code=204)


@router.api_route(
    "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
@e2b_errors
async def not_supported(rest: str, request: Request, res: Res) -> Response:
    """Pause, resume, snapshots, forks, metrics, logs, templates, volumes: none here."""
    await e2b_tenant(request, res)
    return error(501, f"{request.method} /{rest} is not supported by this server (docs/e2b.md)")


async def _running(
    request: Request, res: Res, sandbox_id: str, tenant: str | None = None
) -> SandboxOut:
    """The tenant's running sandbox; E2B's not-found for any other (an ended one too)."""
    if tenant is None:
        tenant = await e2b_tenant(request, res)
    try:
        box = sandboxes.out(await sandboxes.find(res.sessions, tenant, sandbox_id))
    except NotFound:
        box = None
    if box is None or box.status != "running":
        raise NotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
    return box


def _catalogue(res: Res) -> set[str]:
    return set(catalogue(res.settings))


def _image(template: str, catalogue: set[str]) -> str:
    if template == DEFAULT_TEMPLATE and DEFAULT_TEMPLATE not in catalogue:
        return "default"
    return template


def _sandbox(box: SandboxOut, template: str, token: str | None) -> dict[str, Any]:
    """E2B's `Sandbox`: what a create or a connect answers."""
    made: dict[str, Any] = {
        "templateID": template,
        "sandboxID": box.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "alias": box.image,
        "domain": None,
    }
    if token is not None:
        made["envdAccessToken"] = token
    return made


def _listed(box: SandboxOut) -> dict[str, Any]:
    """E2B's `ListedSandbox` of one of ours."""
    return {
        "templateID": box.image,
        "alias": box.image,
        "sandboxID": box.id,
        "clientID": CLIENT_ID,
        "startedAt": box.created_at.isoformat(),
        "endAt": box.expires_at.isoformat(),
        "cpuCount": max(1, round(box.cpus)),
        "memoryMB": box.memory_mb,
        "diskSizeMB": box.disk_mb,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": box.metadata,
    }


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json() if await request.body() else {}
    except ValueError:
        raise InvalidInput("the body must be JSON") from None
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object")
    return body


def _seconds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput("timeout must be a whole number of seconds, at least 1")
    return value


def _details(exc: InvalidInput) -> list[dict[str, Any]]:
    return [d for d in exc.details if isinstance(d, dict)] if isinstance(exc.details, list) else []
