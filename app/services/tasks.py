"""Tasks as clients see them: resolve and check a submission, store it, enqueue it, read it back.

Imported by the API (and the CLI). Every read takes the tenant, so another
tenant's task is simply not found (invariant 6). A task is enqueued on Redis
only after its row is committed (invariant 1).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import Select, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import InvalidInput, NotFound, TooLarge
from app.ids import new_task_id, utc_now
from app.prompt_configs import CUSTOM, resolve_prompt
from app.schemas import (
    ActionOut,
    InputFile,
    Limits,
    LimitsSpec,
    LLMOptions,
    LLMSpec,
    PromptPair,
    SandboxRequest,
    SandboxSpec,
    SkippedArtifact,
    StepOut,
    TaskCreate,
    TaskList,
    TaskOut,
    TaskSpec,
    ToolsOptions,
    TrajectoryOut,
    UsageOut,
)
from app.services import backpressure
from app.services.events import record_event
from app.states import FinishReason, TaskStatus
from app.trajectory_format import reference_trajectory

log = logging.getLogger(__name__)
Problem = dict[str, Any]
N = TypeVar("N", int, float)
Loc = tuple[str | int, ...]

MAX_PATH_CHARS = 1024
MAX_PAGE = 100


# Resolving a submission against the server's defaults and maxima


def resolve_spec(body: TaskCreate, settings: Settings) -> TaskSpec:
    """Fill every default and check every maximum, reporting all violations at once."""
    problems: list[Problem] = []
    spec = TaskSpec(
        llm=_resolve_llm(body.llm, settings, problems),
        limits=_resolve_limits(body.limits, settings, problems),
        sandbox=_resolve_sandbox(body.sandbox, settings, problems),
        tools=_resolve_tools(body.tools, settings, problems),
        **_resolve_prompt(body.prompt_config, settings, problems),
    )
    if problems:
        raise InvalidInput(_summary(problems), details=problems)
    return spec


def _resolve_llm(llm: LLMOptions, settings: Settings, problems: list[Problem]) -> LLMSpec:
    profile = settings.llm_profiles().get(llm.profile)
    if profile is None:
        problems.append(_problem(("llm", "profile"), f"unknown llm profile {llm.profile!r}"))
    model = llm.model or (profile.model if profile else "")
    if profile is not None and not model:
        problems.append(_problem(("llm", "model"), "no model given and the profile has none"))
    elif profile is not None and not profile.allows(model):
        allowed = sorted({*profile.models, profile.model} - {""})
        msg = f"model {model!r} is not allowed by llm profile {llm.profile!r}"
        problems.append(_problem(("llm", "model"), msg, "not_allowed", allowed=allowed))
    return LLMSpec(
        profile=llm.profile,
        model=model,
        temperature=_default(llm.temperature, settings.default_temperature),
        max_tokens_per_call=_bounded(
            problems,
            ("llm", "max_tokens_per_call"),
            llm.max_tokens_per_call,
            settings.default_max_tokens_per_call,
            settings.max_max_tokens_per_call,
        ),
        extra_body=llm.extra_body,
    )


def _resolve_tools(
    tools: ToolsOptions, settings: Settings, problems: list[Problem]
) -> ToolsOptions:
    """The multi-call policy made explicit: the task's, the server's, else the profile's."""
    if tools.shell == "persistent" and not settings.sandbox_exec_channel:
        msg = "a persistent shell needs the exec channel, which this server turned off"
        problems.append(_problem(("tools", "shell"), msg, "not_available"))
    answer_all = tools.answer_all_tool_calls
    if answer_all is None:
        answer_all = settings.answer_all_tool_calls
    if answer_all is None:
        answer_all = tools.profile != "reference"
    return ToolsOptions(profile=tools.profile, answer_all_tool_calls=answer_all, shell=tools.shell)


def _resolve_prompt(
    choice: str | PromptPair, settings: Settings, problems: list[Problem]
) -> dict[str, Any]:
    """`prompt_config` (the name) and `prompt` (templates and directories) for the TaskSpec."""
    try:
        prompt = resolve_prompt(
            choice, workdir=settings.sandbox_workdir, configs_dir=settings.prompt_configs_dir
        )
    except InvalidInput as exc:
        problems.append(_problem(("prompt_config",), exc.message))
        return {"prompt_config": choice if isinstance(choice, str) else CUSTOM, "prompt": None}
    size = len(prompt.system) + len(prompt.instance)
    if size > settings.max_prompt_chars:
        msg = f"templates longer than {settings.max_prompt_chars} characters"
        problems.append(_problem(("prompt_config",), msg))
    return {"prompt_config": prompt.name, "prompt": prompt}


def _resolve_limits(limits: Limits, settings: Settings, problems: list[Problem]) -> LimitsSpec:
    s = settings
    return LimitsSpec(
        max_steps=_bounded(
            problems,
            ("limits", "max_steps"),
            limits.max_steps,
            s.default_max_steps,
            s.max_max_steps,
        ),
        timeout_s=_bounded(
            problems,
            ("limits", "timeout_s"),
            limits.timeout_s,
            s.default_timeout_s,
            s.max_timeout_s,
        ),
        command_timeout_s=_bounded(
            problems,
            ("limits", "command_timeout_s"),
            limits.command_timeout_s,
            s.default_command_timeout_s,
            s.max_command_timeout_s,
        ),
        max_context_tokens=_bounded(
            problems,
            ("limits", "max_context_tokens"),
            limits.max_context_tokens,
            s.default_max_context_tokens,
            s.max_max_context_tokens,
        ),
    )


def _resolve_sandbox(
    box: SandboxRequest, settings: Settings, problems: list[Problem]
) -> SandboxSpec:
    if box.network == "egress" and not settings.sandbox_egress_enabled:
        problems.append(_problem(("sandbox", "network"), "egress is not enabled on this server"))
    if box.image != "default":
        problems.append(_problem(("sandbox", "image"), 'only the "default" image is available'))
    return SandboxSpec(
        image=settings.sandbox_image,
        network=box.network,
        cpus=_bounded(
            problems, ("sandbox", "cpus"), box.cpus, settings.default_cpus, settings.max_cpus
        ),
        memory_mb=_bounded(
            problems,
            ("sandbox", "memory_mb"),
            box.memory_mb,
            settings.default_memory_mb,
            settings.max_memory_mb,
        ),
        disk_mb=_bounded(
            problems,
            ("sandbox", "disk_mb"),
            box.disk_mb,
            settings.default_disk_mb,
            settings.max_disk_mb,
        ),
    )


def _default(value: N | None, default: N) -> N:
    return default if value is None else value


def _bounded(problems: list[Problem], loc: Loc, value: N | None, default: N, limit: N) -> N:
    """The requested value (or the default), noting a problem when it passes the server maximum."""
    if value is None:
        return default
    if value > limit:
        problems.append(
            _problem(loc, f"must be at most {limit}", "less_than_equal", limit=limit, value=value)
        )
    return value


def _problem(loc: Loc, msg: str, type_: str = "invalid", **extra: Any) -> Problem:
    """One violation, shaped like a request-validation error entry (loc, msg, type)."""
    return {"loc": ["body", *loc], "msg": msg, "type": type_, **extra}


def _summary(problems: list[Problem]) -> str:
    return "; ".join(f"{_dotted(p['loc'][1:])}: {p['msg']}" for p in problems)


# Checking the bulky parts of a submission: prompt, metadata, input files


def check_inputs(body: TaskCreate, settings: Settings) -> list[tuple[str, bytes]]:
    """Check sizes and paths, and decode the input files (422 for bad input, 413 when too big)."""
    if len(body.prompt) > settings.max_prompt_chars:
        _reject(("prompt",), f"longer than {settings.max_prompt_chars} characters")
    meta_size = len(json.dumps(body.metadata, separators=(",", ":")).encode())
    if meta_size > settings.max_metadata_bytes:
        _reject(("metadata",), f"larger than {settings.max_metadata_bytes} bytes as JSON")
    if len(body.input_files) > settings.max_input_files:
        _reject(("input_files",), f"more than {settings.max_input_files} files")
    files: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    total = 0
    for i, item in enumerate(body.input_files):
        _check_path(i, item.path, seen)
        content = _decode(i, item, settings.max_input_file_bytes)
        total += len(content)
        if total > settings.max_input_total_bytes:
            _too_large(("input_files",), "in total", settings.max_input_total_bytes)
        files.append((item.path, content))
    return files


def _reject(loc: Loc, msg: str) -> NoReturn:
    raise InvalidInput(f"{_dotted(loc)}: {msg}", details=[_problem(loc, msg)])


def _too_large(loc: Loc, what: str, limit: int) -> NoReturn:
    msg = f"larger than {limit} bytes {what}".rstrip()
    raise TooLarge(f"{_dotted(loc)}: {msg}", details=[_problem(loc, msg, "too_large", limit=limit)])


def _dotted(loc: Loc) -> str:
    return ".".join(map(str, loc))


def _check_path(i: int, path: str, seen: set[str]) -> None:
    """Relative, normalised, NUL-free and unique: it becomes /testbed/input/<path>."""
    loc = ("input_files", i, "path")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        _reject(loc, f"must be at most {MAX_PATH_CHARS} characters without NUL")
    if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        _reject(loc, "must be a relative path without empty, '.' or '..' segments")
    if path in seen:
        _reject(loc, f"duplicate path {path!r}")
    seen.add(path)


def _decode(i: int, item: InputFile, max_bytes: int) -> bytes:
    loc = ("input_files", i, "content_base64")
    text = "".join(item.content_base64.split())  # tolerate line-wrapped base64 (`base64` CLI)
    # Four characters carry three bytes: refuse before decoding something huge.
    if len(text) // 4 * 3 > max_bytes + 3:
        _too_large(loc, "once decoded", max_bytes)
    try:
        content = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
        _reject(loc, "not valid base64")
    if len(content) > max_bytes:
        _too_large(loc, "once decoded", max_bytes)
    return content


# Storing and reading tasks


async def submit_task(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    body: TaskCreate,
    idempotency_key: str | None,
) -> tuple[TaskOut, bool]:
    """Store a queued task and enqueue it; (task, created), or the first task for a repeated key."""
    spec = resolve_spec(body, settings)
    files = check_inputs(body, settings)
    if idempotency_key is not None and (found := await _by_key(sessions, tenant, idempotency_key)):
        return task_out(found), False
    try:
        async with sessions.begin() as session:
            await backpressure.admit(session, settings, tenant)  # 429 when over a limit
            task = _new_task(tenant, body, spec, idempotency_key)
            session.add(task)
            await session.flush()  # the row first: inputs and events reference it
            session.add_all(models.InputBlob(task_id=task.id, path=p, content=c) for p, c in files)
            await record_event(session, task.id, "task.queued", {"status": TaskStatus.queued})
    except IntegrityError:
        # Two requests raced with one key: the unique constraint let only one in.
        if idempotency_key is None or not (
            found := await _by_key(sessions, tenant, idempotency_key)
        ):
            raise
        return task_out(found), False
    # Invariant 1: the row is committed before any worker can hear of it.
    try:
        await queue.enqueue(redis, task.id)
    except (RedisError, OSError) as exc:
        # Accepted all the same: the workers' reconciliation enqueues committed rows.
        log.warning("could not enqueue %s (reconciliation will): %r", task.id, exc)
    return task_out(task), True


def stored_spec(spec: TaskSpec) -> dict[str, Any]:
    """The spec as the row keeps it, readable by the previous release too.

    Stored specs are parsed with the strict API models, which refuse unknown keys, and
    old and new processes overlap during an upgrade (README "Upgrades"): a field a
    release adds is written only when it asks for something the previous release did
    not do, so rows of tasks that use no new option stay readable by it (and a rolled
    back release fails only the tasks that need the new option).
    """
    stored = spec.model_dump(mode="json")
    if spec.tools.shell == "fresh":  # added with the persistent shell
        del stored["tools"]["shell"]
    return stored


def _new_task(
    tenant: str, body: TaskCreate, spec: TaskSpec, idempotency_key: str | None
) -> models.Task:
    return models.Task(
        id=new_task_id(),
        tenant_id=tenant,
        status=TaskStatus.queued,
        prompt=body.prompt,
        spec=stored_spec(spec),
        meta=body.metadata,
        attempt=0,
        usage=UsageOut().model_dump(),
        idempotency_key=idempotency_key,
        last_seq=0,
        created_at=utc_now(),
    )


async def _by_key(sessions: Sessions, tenant: str, key: str) -> models.Task | None:
    async with sessions() as session:
        return await session.scalar(
            select(models.Task).where(
                models.Task.tenant_id == tenant, models.Task.idempotency_key == key
            )
        )


async def find_task(session: AsyncSession, tenant: str, task_id: str) -> models.Task:
    """The tenant's task, or NotFound: the one place the "not yours is not found" rule lives."""
    task = await session.scalar(
        select(models.Task).where(models.Task.id == task_id, models.Task.tenant_id == tenant)
    )
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


async def get_task(sessions: Sessions, tenant: str, task_id: str) -> TaskOut:
    async with sessions() as session:
        return task_out(await find_task(session, tenant, task_id))


async def list_tasks(
    sessions: Sessions,
    tenant: str,
    *,
    status: TaskStatus | None = None,
    limit: int = 20,
    cursor: str | None = None,
) -> TaskList:
    """Newest first, `limit` per page; `next_cursor` continues after the last item."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
    query = _page_query(tenant, status, cursor).limit(limit + 1)
    async with sessions() as session:
        rows = list(await session.scalars(query))
    page = rows[:limit]
    more = len(rows) > limit
    return TaskList(
        items=[task_out(row) for row in page],
        next_cursor=_encode_cursor(page[-1]) if more else None,
    )


def _page_query(tenant: str, status: TaskStatus | None, cursor: str | None) -> Select[models.Task]:
    task = models.Task
    query = select(task).where(task.tenant_id == tenant)
    if status is not None:
        query = query.where(task.status == status)
    if cursor is not None:
        created_at, task_id = _decode_cursor(cursor)
        query = query.where(tuple_(task.created_at, task.id) < tuple_(created_at, task_id))
    return query.order_by(task.created_at.desc(), task.id.desc())


def _encode_cursor(row: models.Task) -> str:
    raw = json.dumps([row.created_at.isoformat(), row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, task_id = json.loads(raw)
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None or not isinstance(task_id, str) or "\x00" in task_id:
            raise ValueError("cursor without a time zone or a usable id")
        return when, task_id
    except (ValueError, TypeError) as exc:
        raise InvalidInput("bad cursor", details=[_problem(("cursor",), "bad cursor")]) from exc


async def get_trajectory(
    sessions: Sessions, tenant: str, task_id: str, attempt: int | None = None
) -> TrajectoryOut:
    """Every recorded step of every attempt (or of one), also while the task runs."""
    query = select(models.Step).where(models.Step.task_id == task_id)
    if attempt is not None:
        query = query.where(models.Step.attempt == attempt)
    async with sessions() as session:
        await find_task(session, tenant, task_id)
        rows = await session.scalars(query.order_by(models.Step.attempt, models.Step.index))
        return TrajectoryOut(task_id=task_id, steps=[step_out(row) for row in rows])


async def get_reference_trajectory(
    sessions: Sessions, tenant: str, task_id: str, attempt: int | None = None
) -> dict[str, Any]:
    """The package's trajectory.json for one attempt (default: the latest), as `sandhive run`."""
    async with sessions() as session:
        task = await find_task(session, tenant, task_id)
        chosen = attempt if attempt is not None else task.attempt
        rows = await session.scalars(
            select(models.Step)
            .where(models.Step.task_id == task_id, models.Step.attempt == chosen)
            .order_by(models.Step.index)
        )
        return reference_trajectory(task.prompt, [step_out(row) for row in rows])


def step_out(row: models.Step) -> StepOut:
    return StepOut(
        index=row.index,
        attempt=row.attempt,
        thought=row.thought,
        reasoning=row.reasoning,
        action=ActionOut.model_validate(row.action) if row.action is not None else None,
        observation=row.observation,
        exit_code=row.exit_code,
        started_at=row.started_at,
        llm_ms=row.llm_ms,
        tool_ms=row.tool_ms,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
    )


def skipped_of(row: models.Task) -> list[SkippedArtifact]:
    """The task's output files that did not become artifacts."""
    return [SkippedArtifact.model_validate(item) for item in row.artifacts_skipped or []]


def task_out(row: models.Task) -> TaskOut:
    """The one mapping from a task row to the wire model."""
    spec = TaskSpec.model_validate(row.spec)
    return TaskOut(
        id=row.id,
        status=TaskStatus(row.status),
        finish_reason=FinishReason(row.finish_reason) if row.finish_reason else None,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        prompt=row.prompt,
        llm=spec.llm,
        limits=spec.limits,
        sandbox=spec.sandbox,
        tools=spec.tools,
        prompt_config=spec.prompt_config,
        metadata=row.meta,
        attempt=row.attempt,
        answer=row.answer,
        usage=UsageOut.model_validate(row.usage),
        error=row.error,
        artifacts_skipped=skipped_of(row),
    )
