"""`/v1/experiments`: create an evaluation run, read it, its results and items, cancel it.

Routes parse, call `services.experiments` / `services.experiment_results`, and answer.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.experiment_schemas import ExperimentCreate, ExperimentOut, ItemList, ItemOut, ResultsOut
from app.schemas import ErrorOut
from app.services import experiment_results, experiments

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 404, 422)}
CSV_COLUMNS = tuple(name for name in ItemOut.model_fields if name != "detail")


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={413: {"model": ErrorOut}, **_ERRORS},
)
async def create_experiment(
    body: ExperimentCreate, response: Response, res: Res, tenant: Tenant
) -> ExperimentOut:
    """Run every row x arm x attempt as a task, scored as each ends (202 + Location)."""
    exp = await experiments.create_experiment(res.sessions, res.redis, res.settings, tenant, body)
    response.headers["Location"] = f"/v1/experiments/{exp.id}"
    return exp


@router.get("/{experiment_id}", response_model=ExperimentOut, responses=_ERRORS)
async def get_experiment(experiment_id: str, res: Res, tenant: Tenant) -> ExperimentOut:
    """Status, and per arm how many items are pending, running, scored, error, cancelled."""
    return await experiments.get_experiment(res.sessions, tenant, experiment_id)


@router.get("/{experiment_id}/results", response_model=ResultsOut, responses=_ERRORS)
async def get_results(experiment_id: str, res: Res, tenant: Tenant) -> ResultsOut:
    """Per arm statistics, and a paired comparison of every pair of arms."""
    return await experiment_results.get_results(res.sessions, tenant, experiment_id)


@router.get(
    "/{experiment_id}/items",
    response_model=ItemList,
    responses={200: {"content": {"text/csv": {}}}, **_ERRORS},
    dependencies=[known_query_only()],
)
async def list_items(
    experiment_id: str,
    res: Res,
    tenant: Tenant,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> ItemList | Response:
    """Every item in start order; `format=csv` for a spreadsheet (without `detail`)."""
    items = await experiments.list_items(res.sessions, tenant, experiment_id)
    if format == "csv":
        return Response(items_csv(items), media_type="text/csv; charset=utf-8")
    return ItemList(items=items)


def items_csv(items: list[ItemOut]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for item in items:
        values = item.model_dump(include=set(CSV_COLUMNS))
        writer.writerow(_cell(values[name]) for name in CSV_COLUMNS)
    return out.getvalue()


def _cell(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


@router.post(
    "/{experiment_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={409: {"model": ErrorOut, "description": "Already finished"}, **_ERRORS},
)
async def cancel_experiment(experiment_id: str, res: Res, tenant: Tenant) -> ExperimentOut:
    """Cancel queued items and stop running ones; each ends `cancelled`."""
    return await experiments.cancel_experiment(res.sessions, res.redis, tenant, experiment_id)
