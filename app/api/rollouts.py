"""`GET /v1/experiments/{id}/export` and `GET /v1/tasks/{id}/export`: rollouts for RL, and
the same records for the tools evaluators read.

Routes check the format and the tenant (404 for another tenant's, before any byte), then
send what `services.rollouts` builds: `jsonl`, one JSON object per line
(`application/x-ndjson`, documented field by field in docs/rl.md); `atif`, Harbor's
trajectory format (a task's as JSON, an experiment's as a zip of a folder); `inspect`, an
experiment arm's Inspect eval log (docs/records.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.schemas.rollouts import ExportFormat, TaskExportFormat
from app.schemas.tasks import ErrorOut
from app.services.rollouts import atif as rollout_atif
from app.services.rollouts import export as rollout_export
from app.services.rollouts import inspect_log

router = APIRouter(tags=["rl"])

MEDIA_TYPE = "application/x-ndjson"
ZIP = "application/zip"
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 404, 422, 501)
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            MEDIA_TYPE: {},
            ZIP: {"schema": {"type": "string", "format": "binary"}},
            inspect_log.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
        "description": "`jsonl`: one JSON object per rollout and line (fields: docs/rl.md); "
        "`atif`: a zip of ATIF trajectories; `inspect`: an Inspect `.eval` log (a zip of "
        "one per arm without `arm=` when there are several)",
    },
    **_ERRORS,
}
_TASK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {MEDIA_TYPE: {}, "application/json": {}},
        "description": "`jsonl`: the rollout as one line; `atif`: its ATIF trajectory",
    },
    **_ERRORS,
}
Format = Annotated[
    ExportFormat,
    Query(
        description="`jsonl`: one rollout per line; `atif`: a zip of ATIF trajectories, "
        "`<experiment>/<arm>/<row>-<attempt>.json`; `inspect`: Inspect eval logs"
    ),
]
Arm = Annotated[
    str | None,
    Query(
        max_length=64,
        description="Only this arm's rollouts (404 for an arm the experiment does not have); "
        "without it, every arm's (with `format=inspect`: the only arm's log, or a zip of "
        "every arm's)",
    ),
]


@router.get(
    "/v1/experiments/{experiment_id}/export",
    response_class=StreamingResponse,
    responses=_RESPONSES,
    dependencies=[known_query_only()],
)
async def export_experiment(
    experiment_id: str, res: Res, tenant: Tenant, format: Format = "jsonl", arm: Arm = None
) -> Response:
    """Every started rollout (row x arm x attempt) of the experiment, in start order: its
    messages, per-message model/environment mask, token ids and logprobs when captured
    (`llm.capture`), reward, GRPO group and advantage, finish reason and whether it was an
    infrastructure failure. `format=atif` and `format=inspect` give the same rollouts as
    Harbor's trajectories and as an Inspect log."""
    if format == "inspect":
        found = await inspect_log.inspect_export(res.sessions, tenant, experiment_id, arm)
        headers = _attachment(found.filename)
        return Response(found.content, media_type=found.media_type, headers=headers)
    if format == "atif":
        chunks = await rollout_atif.open_experiment_atif(res.sessions, tenant, experiment_id, arm)
        return StreamingResponse(
            chunks, media_type=ZIP, headers=_attachment(f"{experiment_id}-atif.zip")
        )
    lines = await rollout_export.open_experiment_export(
        res.sessions, tenant, experiment_id, arm=arm
    )
    return _stream(lines)


@router.get(
    "/v1/tasks/{task_id}/export",
    response_class=StreamingResponse,
    responses=_TASK_RESPONSES,
    dependencies=[known_query_only()],
)
async def export_task(
    task_id: str,
    res: Res,
    tenant: Tenant,
    format: Annotated[
        TaskExportFormat, Query(description="`jsonl`: one line; `atif`: its ATIF trajectory")
    ] = "jsonl",
) -> Response:
    """The task's rollout as one line, in the experiment export's shape (its group and
    advantage when it is an experiment's item); `format=atif`: as an ATIF trajectory."""
    if format == "atif":
        return JSONResponse(await rollout_atif.task_atif(res.sessions, tenant, task_id))
    return _stream(await rollout_export.open_task_export(res.sessions, tenant, task_id))


def _attachment(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}"'}


def _stream(lines: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(lines, media_type=MEDIA_TYPE)
