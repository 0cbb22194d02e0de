"""`GET /v1/experiments/{id}/export` and `GET /v1/tasks/{id}/export`: rollouts for RL.

Routes check the format and the tenant (404 for another tenant's, before any byte),
then stream what `services.rollout_export` builds: one JSON object per line
(`application/x-ndjson`), documented field by field in docs/rl.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.schemas.rollouts import ExportFormat
from app.schemas.tasks import ErrorOut
from app.services.rollouts import export as rollout_export

router = APIRouter(tags=["rl"])

MEDIA_TYPE = "application/x-ndjson"
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {MEDIA_TYPE: {}},
        "description": "One JSON object per rollout and line (fields: docs/rl.md)",
    },
    **{code: {"model": ErrorOut} for code in (401, 404, 422)},
}
Format = Annotated[ExportFormat, Query(description="`jsonl`: one rollout per line")]


@router.get(
    "/v1/experiments/{experiment_id}/export",
    response_class=StreamingResponse,
    responses=_RESPONSES,
    dependencies=[known_query_only()],
)
async def export_experiment(
    experiment_id: str, res: Res, tenant: Tenant, format: Format = "jsonl"
) -> StreamingResponse:
    """Every started rollout (row x arm x attempt) of the experiment, in start order: its
    messages, per-message model/environment mask, token ids and logprobs when captured
    (`llm.capture`), reward, GRPO group and advantage, finish reason and whether it was an
    infrastructure failure."""
    lines = await rollout_export.open_experiment_export(res.sessions, tenant, experiment_id)
    return _stream(lines)


@router.get(
    "/v1/tasks/{task_id}/export",
    response_class=StreamingResponse,
    responses=_RESPONSES,
    dependencies=[known_query_only()],
)
async def export_task(
    task_id: str, res: Res, tenant: Tenant, format: Format = "jsonl"
) -> StreamingResponse:
    """The task's rollout as one line, in the experiment export's shape (its group and
    advantage when it is an experiment's item)."""
    return _stream(await rollout_export.open_task_export(res.sessions, tenant, task_id))


def _stream(lines: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(lines, media_type=MEDIA_TYPE)
