"""Sandbox rows: create (resolved and admitted), read, list, the state changes, the command log.

The row is the truth about a sandbox, as for an episode: the worker holding its container
and the API both end it through `end`, which changes only a sandbox still active, so the
first end (a delete, its expiry, a lost worker) is the one recorded. Its `expires_at` is
the truth about its deadline: the worker re-reads it before it removes an expired one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, insert, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import defaults
from app.config import Settings
from app.db import models
from app.db.engine import Sessions, one_statement
from app.domain.image_catalogue import Image
from app.domain.resolve import resolve_sandbox
from app.errors import Conflict, InvalidInput, NotFound, TooManyRequests
from app.ids import new_sandbox_id, utc_now
from app.schemas.sandboxes import (
    CommandList,
    CommandOut,
    SandboxCreate,
    SandboxList,
    SandboxOut,
)
from app.services.cursors import decode_cursor, encode_cursor
from app.services.webhooks import service as webhooks
from app.specs import SandboxSpec

ACTIVE = ("starting", "running")
DEFAULT_TTL_S = 600
RETRY_S = 5


@dataclass(frozen=True)
class Wanted:
    """What a worker needs to start a sandbox: its resolved request."""

    id: str
    tenant: str
    sandbox: SandboxSpec
    env: dict[str, str]
    read_only_rootfs: bool
    created_at: datetime
    """Its lifetime cap counts from here: its container's own deadline."""
    expires_at: datetime
    built: dict[str, str] | None = None
    """Of a tenant's own image: its `name`, `base` catalogue image and `digest`."""


def out(row: models.SandboxRow) -> SandboxOut:
    spec = row.spec
    return SandboxOut(
        id=row.id,
        status=row.status,
        image=spec["sandbox"]["image_name"],
        network=spec["sandbox"]["network"],
        cpus=spec["sandbox"]["cpus"],
        memory_mb=spec["sandbox"]["memory_mb"],
        disk_mb=spec["sandbox"]["disk_mb"],
        allow_domains=spec["sandbox"]["allow_domains"],
        read_only_rootfs=spec["read_only_rootfs"],
        metadata=row.sandbox_metadata,
        workdir=spec.get("workdir", defaults.WORKDIR),
        created_at=row.created_at,
        expires_at=row.expires_at,
        ended_at=row.ended_at,
        end_reason=row.end_reason,
        error=row.error,
        commands=row.commands,
    )


def new_row(
    settings: Settings,
    tenant: str,
    body: SandboxCreate,
    own: Mapping[str, Image] | None = None,
) -> models.SandboxRow:
    """The `starting` sandbox a request makes, checked (422) but not stored yet; `own`: the
    tenant's own images (`built/NAME`) it may name besides the catalogue's."""
    ttl_s = body.ttl_s or min(DEFAULT_TTL_S, settings.sandbox_max_lifetime_s)
    if ttl_s > settings.sandbox_max_lifetime_s:
        raise InvalidInput(
            f"ttl_s {ttl_s} is over this server's sandbox lifetime of"
            f" {settings.sandbox_max_lifetime_s} s (SANDHIVE_SANDBOX_MAX_LIFETIME_S)",
            details=[{"loc": ["body", "ttl_s"], "msg": "over the lifetime cap", "type": "limit"}],
        )
    if not body.read_only_rootfs and not settings.sandbox_allow_writable_rootfs:
        raise InvalidInput(
            "read_only_rootfs false is not allowed on this server"
            " (SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS)",
            details=[{"loc": ["body", "read_only_rootfs"], "msg": "not allowed", "type": "policy"}],
        )
    sandbox = resolve_sandbox(body, settings, tenant=tenant, own=own)
    now = utc_now()
    return models.SandboxRow(
        id=new_sandbox_id(),
        tenant_id=tenant,
        status="starting",
        spec={
            "sandbox": sandbox.model_dump(mode="json"),
            "env": body.env,
            "read_only_rootfs": body.read_only_rootfs,
            "workdir": settings.sandbox_workdir,
        },
        sandbox_metadata=body.metadata,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )


async def store(sessions: Sessions, settings: Settings, row: models.SandboxRow) -> None:
    """Insert the row once the tenant is under its cap (429 otherwise), in one transaction
    that holds the tenant's advisory lock, so two racing creates cannot both pass."""
    async with sessions.begin() as session:
        # One creator per tenant at a time, until commit: two at once would both count
        # below the cap and both add one.
        key = func.hashtextextended(f"sandboxes:{row.tenant_id}", 0)
        await session.execute(select(func.pg_advisory_xact_lock(key)))
        active = await session.scalar(
            select(func.count())
            .select_from(models.SandboxRow)
            .where(models.SandboxRow.tenant_id == row.tenant_id)
            .where(models.SandboxRow.status.in_(ACTIVE))
        )
        if (active or 0) >= settings.tenant_max_sandboxes:
            raise TooManyRequests(
                f"this tenant has {active} sandboxes, its limit"
                f" (SANDHIVE_TENANT_MAX_SANDBOXES={settings.tenant_max_sandboxes});"
                " delete one or wait for one to expire",
                RETRY_S,
            )
        session.add(row)


def wanted(row: models.SandboxRow) -> Wanted:
    return Wanted(
        id=row.id,
        tenant=row.tenant_id,
        sandbox=SandboxSpec.model_validate(row.spec["sandbox"]),
        env=dict(row.spec["env"]),
        read_only_rootfs=bool(row.spec["read_only_rootfs"]),
        created_at=row.created_at,
        expires_at=row.expires_at,
        built=row.spec.get("built"),
    )


async def find(sessions: Sessions, tenant: str, sandbox_id: str) -> models.SandboxRow:
    """The tenant's sandbox; 404 for an unknown one and for another tenant's alike."""
    async with one_statement(sessions)() as session:
        row = await session.get(models.SandboxRow, sandbox_id)
    if row is None or row.tenant_id != tenant:
        raise NotFound(f"sandbox {sandbox_id} not found")
    return row


async def get(sessions: Sessions, sandbox_id: str) -> models.SandboxRow | None:
    async with one_statement(sessions)() as session:
        return await session.get(models.SandboxRow, sandbox_id)


async def page(
    sessions: Sessions,
    tenant: str,
    *,
    status: str | None,
    metadata: dict[str, str],
    limit: int,
    cursor: str | None,
) -> SandboxList:
    """Newest first, `limit` a page; `metadata`: every key must have its value."""
    query = select(models.SandboxRow).where(models.SandboxRow.tenant_id == tenant)
    if status is not None:
        query = query.where(models.SandboxRow.status == status)
    if metadata:
        query = query.where(models.SandboxRow.sandbox_metadata.contains(metadata))
    if cursor is not None:
        created, last = decode_cursor(cursor)
        query = query.where(
            or_(
                models.SandboxRow.created_at < created,
                and_(models.SandboxRow.created_at == created, models.SandboxRow.id < last),
            )
        )
    query = query.order_by(models.SandboxRow.created_at.desc(), models.SandboxRow.id.desc())
    async with sessions() as session:
        rows = list((await session.scalars(query.limit(limit + 1))).all())
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
    return SandboxList(items=[out(row) for row in rows], next_cursor=next_cursor)


async def running(sessions: Sessions, sandbox_id: str, worker: str) -> models.SandboxRow | None:
    """Mark a `starting` sandbox running on `worker` (`sandbox.created` in the same
    transaction); None when it ended meanwhile (the API gave up on its start)."""
    async with sessions.begin() as session:
        row: models.SandboxRow | None = await session.scalar(
            update(models.SandboxRow)
            .where(models.SandboxRow.id == sandbox_id, models.SandboxRow.status == "starting")
            .values(status="running", worker=worker)
            .returning(models.SandboxRow)
        )
        if row is not None:
            await _announce(session, row, "sandbox.created")
    return row


async def _announce(session: AsyncSession, row: models.SandboxRow, event: str) -> None:
    """A `sandbox.*` webhook event, in the transaction of the change: the sandbox as GET
    returns it."""
    await webhooks.enqueue(session, row.tenant_id, event, lambda: out(row).model_dump(mode="json"))


async def end(sessions: Sessions, sandbox_id: str, reason: str, error: str | None = None) -> bool:
    """End an active sandbox (`sandbox.ended` in the same transaction); False when it had
    already ended (the first end stands)."""
    async with sessions.begin() as session:
        ended = await session.scalar(
            update(models.SandboxRow)
            .where(models.SandboxRow.id == sandbox_id, models.SandboxRow.status.in_(ACTIVE))
            .values(status="ended", end_reason=reason, error=error, ended_at=utc_now())
            .returning(models.SandboxRow)
        )
        if ended is not None:
            await _announce(session, ended, "sandbox.ended")
    return ended is not None


async def states(sessions: Sessions, ids: list[str]) -> dict[str, tuple[str, datetime]]:
    """Each sandbox's status and deadline (its worker's upkeep reads them every second)."""
    async with one_statement(sessions)() as session:
        found = await session.execute(
            select(
                models.SandboxRow.id, models.SandboxRow.status, models.SandboxRow.expires_at
            ).where(models.SandboxRow.id.in_(ids))
        )
    return {str(row_id): (str(status), expires) for row_id, status, expires in found.all()}


async def expire(sessions: Sessions, sandbox_id: str) -> bool:
    """End it `expired` if it still runs and its deadline has passed by Postgres's clock (an
    extension that came first wins); whether it did."""
    async with sessions.begin() as session:
        ended = await session.scalar(
            update(models.SandboxRow)
            .where(
                models.SandboxRow.id == sandbox_id,
                models.SandboxRow.status == "running",
                models.SandboxRow.expires_at <= func.now(),
            )
            .values(status="ended", end_reason="expired", ended_at=utc_now())
            .returning(models.SandboxRow)
        )
        if ended is not None:
            await _announce(session, ended, "sandbox.ended")
    return ended is not None


async def announce_expiring(sessions: Sessions, sandbox_id: str, expires_at: float) -> bool:
    """`sandbox.expiring` for the deadline `expires_at` (epoch seconds), if it is still the
    running sandbox's; whether it was written."""
    async with sessions.begin() as session:
        row = await session.get(models.SandboxRow, sandbox_id)
        if row is None or row.status != "running" or row.expires_at.timestamp() != expires_at:
            return False
        await _announce(session, row, "sandbox.expiring")
        return True


async def extend(
    sessions: Sessions, settings: Settings, tenant: str, sandbox_id: str, ttl_s: int
) -> models.SandboxRow:
    """Its deadline moved to now + `ttl_s`, within its lifetime cap (422 beyond); 409 once
    it ended."""
    row = await find(sessions, tenant, sandbox_id)
    now = utc_now()
    cap = row.created_at + timedelta(seconds=settings.sandbox_max_lifetime_s)
    expires = now + timedelta(seconds=ttl_s)
    if expires > cap:
        left = max(0, int((cap - now).total_seconds()))
        raise InvalidInput(
            f"ttl_s {ttl_s} would take sandbox {sandbox_id} past its lifetime cap"
            f" (SANDHIVE_SANDBOX_MAX_LIFETIME_S): at most {left} s from now",
            details=[{"loc": ["body", "ttl_s"], "msg": f"at most {left}", "type": "limit"}],
        )
    async with sessions.begin() as session:
        moved: models.SandboxRow | None = await session.scalar(
            update(models.SandboxRow)
            .where(models.SandboxRow.id == sandbox_id, models.SandboxRow.status.in_(ACTIVE))
            .values(expires_at=expires)
            .returning(models.SandboxRow)
        )
    if moved is None:
        raise ended_conflict(await find(sessions, tenant, sandbox_id))
    return moved


def ended_conflict(row: models.SandboxRow) -> Conflict:
    return Conflict(
        f"sandbox {row.id} has ended ({row.end_reason}): make a new one",
        details={"status": row.status, "end_reason": row.end_reason, "error": row.error},
    )


async def active_on(sessions: Sessions, worker: str) -> list[str]:
    """The active sandboxes the rows say `worker` holds."""
    async with one_statement(sessions)() as session:
        found = await session.scalars(
            select(models.SandboxRow.id).where(
                models.SandboxRow.worker == worker, models.SandboxRow.status.in_(ACTIVE)
            )
        )
        return list(found.all())


async def active_by_worker(sessions: Sessions) -> dict[str, list[str]]:
    async with one_statement(sessions)() as session:
        rows = await session.execute(
            select(models.SandboxRow.worker, models.SandboxRow.id).where(
                models.SandboxRow.status == "running", models.SandboxRow.worker.is_not(None)
            )
        )
    by_worker: dict[str, list[str]] = {}
    for worker, sandbox_id in rows.all():
        by_worker.setdefault(str(worker), []).append(str(sandbox_id))
    return by_worker


async def starting_before(sessions: Sessions, before: datetime) -> list[str]:
    """`starting` sandboxes created before `before`: nobody will start them any more."""
    async with one_statement(sessions)() as session:
        found = await session.scalars(
            select(models.SandboxRow.id).where(
                models.SandboxRow.status == "starting", models.SandboxRow.created_at < before
            )
        )
        return list(found.all())


async def load_per_worker(sessions: Sessions) -> dict[str, int]:
    """How many active sandboxes each worker holds (to place a new one on the least busy)."""
    async with one_statement(sessions)() as session:
        rows = await session.execute(
            select(models.SandboxRow.worker, func.count())
            .where(models.SandboxRow.status.in_(ACTIVE), models.SandboxRow.worker.is_not(None))
            .group_by(models.SandboxRow.worker)
        )
    return {str(worker): int(count) for worker, count in rows.all()}


async def log_sent(
    sessions: Sessions,
    sandbox_id: str,
    command_id: str,
    *,
    key_id: str | None,
    logged: dict[str, Any],
) -> None:
    """Append a command to the sandbox's log (and count it) as it is sent: one statement,
    the count's update and the entry's insert together (its `seq` is the new count)."""
    counted = (
        update(models.SandboxRow)
        .where(models.SandboxRow.id == sandbox_id)
        .values(commands=models.SandboxRow.commands + 1)
        .returning(models.SandboxRow.commands)
        .cte("counted")
    )
    values = {
        "id": command_id,
        "sandbox_id": sandbox_id,
        "key_id": key_id,
        "argv": logged["argv"],
        "command": logged["command"],
        "user": logged["user"],
        "cwd": logged["cwd"],
        "truncated": logged["truncated"],
        "timed_out": False,
        "started_at": utc_now(),
    }
    columns = models.SandboxCommandRow.__table__.c
    entry = select(
        *(literal(value, columns[name].type) for name, value in values.items()), counted.c.commands
    )
    async with one_statement(sessions).begin() as session:
        seq = await session.scalar(
            insert(models.SandboxCommandRow)
            .from_select([*values, "seq"], entry)
            .returning(models.SandboxCommandRow.seq)
        )
    if seq is None:  # no row to count it in: never run a command the log does not hold
        raise NotFound(f"sandbox {sandbox_id} not found")


async def log_ended(
    sessions: Sessions,
    command_id: str,
    *,
    exit_code: int | None,
    timed_out: bool,
    duration_ms: int,
) -> None:
    """The command's outcome, in its log entry."""
    async with one_statement(sessions).begin() as session:
        await session.execute(
            update(models.SandboxCommandRow)
            .where(models.SandboxCommandRow.id == command_id)
            .values(exit_code=exit_code, timed_out=timed_out, duration_ms=duration_ms)
        )


async def commands(
    sessions: Sessions, tenant: str, sandbox_id: str, *, limit: int, after: int
) -> CommandList:
    """The sandbox's command log in the order they were sent; `after`: the last `seq` seen."""
    await find(sessions, tenant, sandbox_id)
    async with sessions() as session:
        rows = list(
            (
                await session.scalars(
                    select(models.SandboxCommandRow)
                    .where(
                        models.SandboxCommandRow.sandbox_id == sandbox_id,
                        models.SandboxCommandRow.seq > after,
                    )
                    .order_by(models.SandboxCommandRow.seq)
                    .limit(limit + 1)
                )
            ).all()
        )
    more = len(rows) > limit
    rows = rows[:limit]
    items = [
        CommandOut(
            id=row.id,
            seq=row.seq,
            argv=row.argv,
            command=row.command,
            user=row.user,
            cwd=row.cwd,
            truncated=row.truncated,
            exit_code=row.exit_code,
            timed_out=row.timed_out,
            duration_ms=row.duration_ms,
            started_at=row.started_at,
            key_id=row.key_id,
        )
        for row in rows
    ]
    return CommandList(items=items, next_cursor=str(rows[-1].seq) if more else None)
