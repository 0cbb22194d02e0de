"""`/v1/tasks`: submit (JSON or multipart), list, read one, read its trajectory.

Routes parse, call `services.tasks`, and answer; nothing else lives here.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from app.api.deps import Res, Tenant
from app.api.multipart import add_multipart_route, multipart_doc
from app.api.query import known_query_only
from app.config import Settings
from app.errors import InvalidInput, TooLarge
from app.resources import Resources
from app.schemas.batches import TaskBatchCreate, TaskBatchOut
from app.schemas.tasks import (
    ErrorOut,
    TaskCreate,
    TaskForkIn,
    TaskForkOut,
    TaskList,
    TaskOut,
    TrajectoryOut,
)
from app.services.cursors import CURSOR_PATTERN
from app.services.rollouts import atif as rollout_atif
from app.services.tasks import batch, cancel
from app.services.tasks import forks as task_forks
from app.services.tasks import service as tasks
from app.services.tasks.filters import (
    MAX_Q_CHARS,
    METADATA_PREFIX,
    TaskFilters,
    iso_time,
    metadata_filters,
)
from app.states import TaskStatus

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

IdempotencyKey = Annotated[str | None, Header(min_length=1, max_length=200)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 404, 413, 422)
}
_SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    429: {"model": ErrorOut, "description": "Over a queue limit; see Retry-After"},
}
_MULTIPART_DOC = multipart_doc(
    ["task"],
    {
        "task": {"type": "string", "description": "The task as JSON"},
        "files": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "description": "Any other file part: its filename is its input path",
        },
    },
    other_parts={"type": "string", "format": "binary"},
)
_TASK_PART_MAX_BYTES = 4 * 2**20


async def create_task_multipart(
    request: Request,
    response: Response,
    res: Res,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> TaskOut:
    """The same submission as multipart/form-data: a `task` JSON part plus one part per file."""
    s = res.settings
    form = request.form(
        max_files=s.max_input_files + 1, max_fields=8, max_part_size=_TASK_PART_MAX_BYTES
    )
    async with form as parts:
        body = await _task_from_parts(parts, s)
    return await _submit(response, res, tenant, body, idempotency_key)


add_multipart_route(router, create_task_multipart, TaskOut)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskOut,
    responses={
        200: {"model": TaskOut, "description": "An Idempotency-Key repeat"},
        **_SUBMIT_ERRORS,
    },
    openapi_extra=_MULTIPART_DOC,
)
async def create_task(
    body: TaskCreate,
    response: Response,
    res: Res,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> TaskOut:
    """Queue a task (202 + Location); a repeated Idempotency-Key answers 200 with the first."""
    return await _submit(response, res, tenant, body, idempotency_key)


@router.post(
    "/batch",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskBatchOut,
    responses=_SUBMIT_ERRORS,
)
async def create_tasks_batch(body: TaskBatchCreate, res: Res, tenant: Tenant) -> TaskBatchOut:
    """Queue many tasks at once: all are valid and admitted (202), or none is stored.

    A 422 names the task and field (`tasks.3.limits.max_steps`); a 429 means the whole
    batch does not fit the tenant's limits. Each task may carry its own `idempotency_key`.
    """
    return await batch.submit_batch(res.sessions, res.redis, res.settings, tenant, body)


async def _submit(
    response: Response, res: Resources, tenant: str, body: TaskCreate, idempotency_key: str | None
) -> TaskOut:
    task, created = await tasks.submit_task(
        res.sessions, res.redis, res.settings, tenant, body, idempotency_key
    )
    response.headers["Location"] = f"/v1/tasks/{task.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return task


async def _task_from_parts(parts: FormData, settings: Settings) -> TaskCreate:
    """The `task` part's JSON with every file part appended to `input_files`."""
    task_part = parts.get("task")
    if task_part is None:
        raise InvalidInput("a multipart submission needs a `task` part")
    try:
        raw = task_part if isinstance(task_part, str) else await task_part.read()
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput("the `task` part is not valid JSON") from exc
    if not isinstance(data, dict):
        raise InvalidInput("the `task` part must be a JSON object")
    uploads = [v for k, v in parts.multi_items() if k != "task" and isinstance(v, UploadFile)]
    _check_upload_sizes(uploads, settings)
    files = [await _input_file(upload) for upload in uploads]
    listed = data.get("input_files") or []
    if not isinstance(listed, list):
        raise InvalidInput("`input_files` in the `task` part must be a list")
    data["input_files"] = [*listed, *files]
    try:
        return TaskCreate.model_validate(data)
    except ValidationError as exc:
        details = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()
        ]
        raise InvalidInput("the `task` part is not valid", details=details) from exc


def _check_upload_sizes(uploads: list[UploadFile], settings: Settings) -> None:
    """Refuse big files from their size alone, before reading them into memory."""
    for upload in uploads:
        if (upload.size or 0) > settings.max_input_file_bytes:
            raise TooLarge(f"{upload.filename}: larger than {settings.max_input_file_bytes} bytes")
    if sum(upload.size or 0 for upload in uploads) > settings.max_input_total_bytes:
        raise TooLarge(f"input files exceed {settings.max_input_total_bytes} bytes in total")


async def _input_file(upload: UploadFile) -> dict[str, str]:
    if not upload.filename:
        raise InvalidInput("every file part needs a filename: it is the file's input path")
    content = await upload.read()
    return {"path": upload.filename, "content_base64": base64.b64encode(content).decode()}


@router.get(
    "",
    response_model=TaskList,
    responses=_ERRORS,
    dependencies=[known_query_only(families=(METADATA_PREFIX,))],
)
async def list_tasks(
    request: Request,
    res: Res,
    tenant: Tenant,
    status: TaskStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=tasks.MAX_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=100, pattern=CURSOR_PATTERN)] = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_Q_CHARS,
            description="Case-insensitive substring of the prompt or the task id",
        ),
    ] = None,
    model: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description="The task's resolved model, exactly"),
    ] = None,
    created_after: Annotated[
        str | None,
        Query(
            max_length=64,
            description="ISO 8601 time, inclusive; no zone means UTC",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    created_before: Annotated[
        str | None,
        Query(
            max_length=64,
            description="ISO 8601 time, exclusive; no zone means UTC",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    in_experiment: Annotated[
        bool | None,
        Query(description="true: only the tasks of experiments' items; false: only the others"),
    ] = None,
    forked_from: Annotated[
        str | None,
        Query(min_length=1, max_length=40, description="Only the forks of this task"),
    ] = None,
) -> TaskList:
    """The tenant's tasks, newest first; pass `next_cursor` back as `cursor` for the next page.

    Filters combine with AND; `metadata.KEY=VALUE` (repeatable) keeps tasks whose metadata
    has KEY equal to VALUE (as a string, or as the number/boolean/null it spells).
    """
    filters = TaskFilters(
        q=q,
        model=model,
        metadata=metadata_filters(request.query_params.multi_items()),
        created_after=iso_time("created_after", created_after),
        created_before=iso_time("created_before", created_before),
        in_experiment=in_experiment,
        forked_from=forked_from,
    )
    return await tasks.list_tasks(
        res.sessions, tenant, status=status, limit=limit, cursor=cursor, filters=filters
    )


@router.get("/{task_id}", response_model=TaskOut, responses=_ERRORS)
async def get_task(task_id: str, res: Res, tenant: Tenant) -> TaskOut:
    return await tasks.get_task(res.sessions, tenant, task_id)


@router.post(
    "/{task_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskOut,
    responses={409: {"model": ErrorOut, "description": "The task already finished"}, **_ERRORS},
)
async def cancel_task(task_id: str, res: Res, tenant: Tenant) -> TaskOut:
    """Cancel: a queued task ends at once, a running one's sandbox stops within seconds."""
    return await cancel.cancel_task(res.sessions, res.redis, tenant, task_id)


@router.post(
    "/{task_id}/fork",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskForkOut,
    responses=_SUBMIT_ERRORS,
)
async def fork_task(task_id: str, body: TaskForkIn, res: Res, tenant: Tenant) -> TaskForkOut:
    """Fork a task from one of its steps (docs/fork.md): `n` new tasks that replay its
    steps before `step` in a fresh sandbox, each answer checked against the record, then
    go on with a model (its own or the one given). 404 for a step it never completed."""
    return await task_forks.fork_task(res.sessions, res.redis, res.settings, tenant, task_id, body)


@router.get(
    "/{task_id}/trajectory",
    response_model=TrajectoryOut | dict[str, Any],
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def get_trajectory(
    task_id: str,
    res: Res,
    tenant: Tenant,
    attempt: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    format: Annotated[Literal["sandhive", "reference", "atif"], Query()] = "sandhive",
) -> TrajectoryOut | dict[str, Any]:
    """The steps so far, ordered by attempt then index (`attempt=N`: only that attempt's).

    `format=reference`: the paper package's trajectory.json of one attempt (default the
    latest): problem_statement, steps[thought, reasoning_content, action, observation,
    metadata], metadata.total_steps.

    `format=atif`: one attempt (default the latest) in Harbor's Agent Trajectory
    Interchange Format v1.7 (docs/records.md).
    """
    if format == "atif":
        return await rollout_atif.task_atif(res.sessions, tenant, task_id, attempt)
    if format == "reference":
        return await tasks.get_reference_trajectory(res.sessions, tenant, task_id, attempt)
    return await tasks.get_trajectory(res.sessions, tenant, task_id, attempt)
