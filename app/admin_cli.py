"""`sandhive admin`: the operator's commands (workers, drain, requeue, fail, prune).

Each command builds Settings, opens Postgres and/or Redis for one call of
`app.services.admin`, prints the result and exits (1 on a refused request).
Imported by app.cli only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings

admin_cli = typer.Typer(
    help="Operate a deployment: workers, drain, requeue, fail, prune.", no_args_is_help=True
)
_T = TypeVar("_T")
Use = Callable[[async_sessionmaker[AsyncSession], Redis], Awaitable[_T]]


def _run(use: Use[_T]) -> _T:
    """One call with Postgres and Redis open; a refused request exits 1 with its message."""
    from app.db.engine import create_engine, create_sessions
    from app.errors import AppError

    settings = Settings()

    async def _go() -> _T:
        engine = create_engine(settings.database_url)
        redis = Redis.from_url(settings.redis_url)
        try:
            return await use(create_sessions(engine), redis)
        finally:
            await redis.aclose()
            await engine.dispose()

    try:
        return asyncio.run(_go())
    except AppError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc


@admin_cli.command("workers")
def workers() -> None:
    """Live workers (from their heartbeats): name, host, pid, busy/slots, draining."""
    from app.services import admin

    found = _run(lambda _sessions, redis: admin.list_workers(redis))
    typer.echo("worker\thost\tpid\tbusy/slots\tstate")
    for item in found:
        state = "draining" if item.draining else "active"
        typer.echo(f"{item.name}\t{item.host}\t{item.pid}\t{item.busy}/{item.slots}\t{state}")


@admin_cli.command("drain")
def drain(
    worker: Annotated[str, typer.Argument(help="The worker's name (see `workers`).")],
) -> None:
    """Stop a worker taking tasks; it exits after its running ones (SIGTERM's grace applies)."""
    from app.services import admin

    _run(lambda _sessions, redis: admin.drain(redis, worker))
    typer.echo(f"draining {worker}: it stops claiming at its next heartbeat")


@admin_cli.command("requeue")
def requeue(task_id: Annotated[str, typer.Argument(help="The task's id (tsk_...).")]) -> None:
    """Put a queued or running task on the queue again (a running one gets a new attempt)."""
    from app.services import admin

    was = _run(lambda sessions, redis: admin.requeue(sessions, redis, task_id))
    typer.echo(f"requeued {task_id} (was {was})")


@admin_cli.command("fail")
def fail(
    task_id: Annotated[str, typer.Argument(help="The task's id (tsk_...).")],
    reason: Annotated[str, typer.Option(help="Why, stored in the task's error.")] = "",
) -> None:
    """End a queued or running task as failed (sandbox_error) now."""
    from app.services import admin

    _run(lambda sessions, redis: admin.fail(sessions, redis, task_id, reason))
    typer.echo(f"failed {task_id}")


@admin_cli.command("prune")
def prune(
    task_days: Annotated[
        float | None, typer.Option(help="Delete tasks finished more than this many days ago.")
    ] = None,
    artifact_days: Annotated[
        float | None,
        typer.Option(help="Delete artifacts of tasks finished more than this many days ago."),
    ] = None,
) -> None:
    """Delete old finished tasks and artifacts (defaults: the retention settings)."""
    from app.services import admin

    settings = Settings()
    tasks = settings.task_retention_days if task_days is None else task_days
    outputs = settings.artifact_retention_days if artifact_days is None else artifact_days
    pruned = _run(
        lambda sessions, _redis: admin.prune(sessions, task_days=tasks, artifact_days=outputs)
    )
    typer.echo(f"pruned {pruned.tasks} tasks and {pruned.artifacts} artifacts")
