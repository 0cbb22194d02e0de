"""`/v1/experiments`: create an evaluation run (JSON, or multipart with a dataset file), list
them, read one, its results and items, cancel it.

Routes parse, call `services.experiments` / `services.experiment_results`, and answer.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status

from app.api.deps import Res, Tenant
from app.api.multipart import add_multipart_route, is_multipart, multipart_doc
from app.api.query import known_query_only
from app.errors import UnsupportedMediaType
from app.resources import Resources
from app.schemas.experiments import (
    ExperimentCreate,
    ExperimentList,
    ExperimentOut,
    ItemList,
    ItemOut,
    PackageResults,
    RegradeIn,
    ResultsOut,
)
from app.schemas.tasks import ErrorOut
from app.services.cursors import CURSOR_PATTERN
from app.services.experiments import package as experiment_package
from app.services.experiments import regrade as experiment_regrade
from app.services.experiments import results as experiment_results
from app.services.experiments import service as experiments
from app.services.experiments.upload import experiment_from_parts

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 404, 422)}
CSV_COLUMNS = tuple(name for name in ItemOut.model_fields if name not in ("detail", "gradings"))
ExperimentStatus = Literal["running", "finished", "cancelled"]
_SPEC_FIELD_MAX_BYTES = 4 * 2**20
_MULTIPART_DOC = multipart_doc(
    ["spec", "dataset"],
    {
        "spec": {
            "type": "string",
            "description": "The JSON body without `dataset` (a field or a file)",
        },
        "dataset": {
            "type": "string",
            "format": "binary",
            "description": "The rows: a .jsonl file (one row per line) or a "
            '.json file (a list of rows, or {"rows": [...]})',
        },
    },
)


async def create_experiment_multipart(
    request: Request, response: Response, res: Res, tenant: Tenant
) -> ExperimentOut:
    """The same submission as multipart/form-data: a `spec` part and a `dataset` file."""
    form = request.form(max_files=2, max_fields=4, max_part_size=_SPEC_FIELD_MAX_BYTES)
    async with form as parts:  # file parts are spooled to disk past 1 MiB, then read in chunks
        body = await experiment_from_parts(parts.get("spec"), parts.get("dataset"), res.settings)
    return await _create(response, res, tenant, body)


add_multipart_route(router, create_experiment_multipart, ExperimentOut)


@router.post(
    "/upload",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={413: {"model": ErrorOut}, 415: {"model": ErrorOut}, **_ERRORS},
    openapi_extra=_MULTIPART_DOC,
)
async def upload_experiment(
    request: Request, response: Response, res: Res, tenant: Tenant
) -> ExperimentOut:
    """`POST /v1/experiments` as multipart/form-data: a `spec` part (the JSON body without
    `dataset`) and a `dataset` file part (.jsonl, or .json), for datasets larger than a JSON
    body may be. `POST /v1/experiments` takes the same parts; this operation is the one
    OpenAPI documents them on, so that generated clients get one body type per operation."""
    if not is_multipart(request.scope):
        raise UnsupportedMediaType("send multipart/form-data: a `spec` part and a `dataset` file")
    return await create_experiment_multipart(request, response, res, tenant)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={413: {"model": ErrorOut}, **_ERRORS},
)
async def create_experiment(
    body: ExperimentCreate, response: Response, res: Res, tenant: Tenant
) -> ExperimentOut:
    """Run every row x arm x attempt as a task, scored as each ends (202 + Location).

    Also as multipart/form-data (documented on `POST /v1/experiments/upload`, which takes
    the same parts): a `spec` part and a `dataset` file, for datasets larger than a JSON
    body may be.
    """
    return await _create(response, res, tenant, body)


async def _create(
    response: Response, res: Resources, tenant: str, body: ExperimentCreate
) -> ExperimentOut:
    exp = await experiments.create_experiment(res.sessions, res.redis, res.settings, tenant, body)
    response.headers["Location"] = f"/v1/experiments/{exp.id}"
    return exp


@router.get("", response_model=ExperimentList, responses=_ERRORS, dependencies=[known_query_only()])
async def list_experiments(
    res: Res,
    tenant: Tenant,
    status: ExperimentStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=experiments.MAX_PAGE)] = experiments.DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=100, pattern=CURSOR_PATTERN)] = None,
) -> ExperimentList:
    """The tenant's experiments, newest first; pass `next_cursor` back as `cursor`."""
    return await experiments.list_experiments(
        res.sessions, tenant, status=status, limit=limit, cursor=cursor
    )


@router.get("/{experiment_id}", response_model=ExperimentOut, responses=_ERRORS)
async def get_experiment(experiment_id: str, res: Res, tenant: Tenant) -> ExperimentOut:
    """Status, and per arm how many items are pending, running, scored, error, cancelled."""
    return await experiments.get_experiment(res.sessions, tenant, experiment_id)


@router.get(
    "/{experiment_id}/results",
    response_model=ResultsOut | PackageResults,
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def get_results(
    experiment_id: str,
    res: Res,
    tenant: Tenant,
    format: Annotated[Literal["sandhive", "package"], Query()] = "sandhive",
    grading: Annotated[int | None, Query(ge=1)] = None,
) -> ResultsOut | PackageResults:
    """Per arm statistics, and a paired comparison of every pair of arms (of the current
    scoring; `grading=N` for an earlier one, 1 being the original).

    `format=package`: per arm, the reference package's results.json (config, task, total,
    mean_score with errors as 0, num_errors, elapsed_time_seconds).
    """
    if format == "package":
        return await experiment_package.get_package_results(
            res.sessions, res.settings, tenant, experiment_id, grading
        )
    return await experiment_results.get_results(res.sessions, tenant, experiment_id, grading)


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


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as a formula at the start of a cell (OWASP's CSV injection list)."""


def _cell(value: object) -> str:
    """A cell as text. Text a model wrote (`answer`) that a spreadsheet would run as a
    formula (`=HYPERLINK(...)`) gets a leading `'`, which spreadsheets show as text; a
    plain number such as `-1.5` is left as it is."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return json.dumps(value)
    return "'" + value if value.startswith(FORMULA_START) and not _number(value) else value


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@router.post(
    "/{experiment_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={409: {"model": ErrorOut, "description": "Already finished"}, **_ERRORS},
)
async def cancel_experiment(experiment_id: str, res: Res, tenant: Tenant) -> ExperimentOut:
    """Cancel queued items and stop running ones; each ends `cancelled`."""
    return await experiments.cancel_experiment(res.sessions, res.redis, tenant, experiment_id)


@router.post(
    "/{experiment_id}/regrade",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ExperimentOut,
    responses={409: {"model": ErrorOut, "description": "Still running"}, **_ERRORS},
)
async def regrade_experiment(
    experiment_id: str, body: RegradeIn, res: Res, tenant: Tenant
) -> ExperimentOut:
    """Score the stored answers again with another scorer, running no task; the earlier
    scoring stays readable (`results?grading=N`, each item's `gradings`)."""
    return await experiment_regrade.regrade(
        res.sessions, res.redis, res.settings, tenant, experiment_id, body.scorer
    )
