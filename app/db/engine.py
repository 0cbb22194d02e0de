"""The async engine and session factory, and the one clock every process shares."""

from __future__ import annotations

import functools
import time
import weakref
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy import event, func, select
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import await_only

from app import defaults

Sessions = async_sessionmaker[AsyncSession]
"""The session factory every use case receives."""


POOL_SIZE = 5
"""SQLAlchemy's default: connections kept open between uses."""
DRIVER_FAILURES = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a backend killed while pooled, as the ping meets it
)
"""What a ping on a dead connection raises; anything else is a bug, not an outage."""
FRESH = "sandhive.fresh"
"""A pool entry's `info` key: opened, not lent yet (`info` is cleared when it is replaced)."""
RETURNED = "sandhive.returned"
"""A pool entry's `info` key: when it was last given back (`time.monotonic()`)."""


def create_engine(
    database_url: str,
    *,
    pool_size: int = POOL_SIZE,
    ping_bypass_s: float = defaults.DATABASE_PING_BYPASS_S,
) -> AsyncEngine:
    """`pool_size` connections are kept; up to 10 more are opened when busy, and closed as
    soon as they are returned: a pool smaller than what runs at once costs a connect (and
    a Postgres backend's fork) per transaction. A connection lent after it idled in the pool
    for `ping_bypass_s` or more (`SANDHIVE_DATABASE_PING_BYPASS_S`) is pinged first
    (`_ping`), so one that died there (Postgres restarted) is replaced, not failed."""
    engine = create_async_engine(database_url, pool_size=pool_size, max_overflow=10)
    event.listen(engine.sync_engine, "connect", _fresh)
    event.listen(engine.sync_engine, "checkin", _returned)
    event.listen(engine.sync_engine, "checkout", functools.partial(_ping, bypass_s=ping_bypass_s))
    return engine


def _fresh(_dbapi_connection: Any, entry: ConnectionPoolEntry) -> None:
    """A connection just opened: its first checkout needs no ping (`_ping`)."""
    entry.info[FRESH] = True


def _returned(_dbapi_connection: Any, entry: ConnectionPoolEntry) -> None:
    """A connection given back: lent again within the ping's bypass, it needs none."""
    entry.info[RETURNED] = time.monotonic()


def _ping(
    _dbapi_connection: Any, entry: ConnectionPoolEntry, _proxy: Any, *, bypass_s: float
) -> None:
    """The pool's check of a connection before it lends it: `SELECT 1`, one round trip.

    It stands in for SQLAlchemy's `pool_pre_ping`, which with asyncpg is three round trips
    (BEGIN, the ping, ROLLBACK) on every checkout: the transaction is there so that an
    asyncpg ping sent as a prepared statement works behind PgBouncer's transaction pooling
    (sqlalchemy#10226). An `execute` without arguments uses the simple query protocol,
    never a prepared statement, so it needs none. (Not the empty query `pool_pre_ping`
    sends: asyncpg 0.32's simple protocol fails on its empty answer.) On failure the pool
    drops every connection older than now and lends a new one, as `pool_pre_ping` does.
    A connection opened for this checkout is not pinged, as `pool_pre_ping` does not ping
    one: if it fails, the caller's own statement fails with the driver's error, which
    `app.kit.outage` knows for an outage (a failed ping there would end, after the pool's
    second try, in an `InvalidRequestError` that is not). Nor is one given back less than
    `bypass_s` ago (half a second by default): it worked a moment ago, and if it died since,
    the caller's own statement fails as on a fresh one. For that to hit, Postgres must go
    down and be back within that time. Then each caller lent such a connection meets one
    error (503 in the API; a task's attempt ends `infrastructure` and runs again), never a
    wrong answer, until the first failure makes the pool drop its older connections. The time counts
    from the connection's return, not its last statement: nothing holds a connection idle
    across a long wait before giving it back.
    """
    if entry.info.pop(FRESH, False):
        return
    returned = entry.info.get(RETURNED)
    if returned is not None and time.monotonic() - returned < bypass_s:
        return
    driver = entry.driver_connection
    assert driver is not None, "the pool lends only connections it holds"
    try:
        await_only(driver.execute("SELECT 1"))
    except DRIVER_FAILURES as exc:
        raise InvalidatePoolError(f"a pooled connection failed its ping: {exc!r}") from exc


def create_sessions(engine: AsyncEngine) -> Sessions:
    # expire_on_commit=False: async code cannot lazy-load an expired attribute.
    return async_sessionmaker(engine, expire_on_commit=False)


_AUTOCOMMIT: weakref.WeakKeyDictionary[Sessions, AsyncEngine] = weakref.WeakKeyDictionary()
_ONE_STATEMENT: weakref.WeakKeyDictionary[Sessions, Sessions] = weakref.WeakKeyDictionary()


def autocommit(sessions: Sessions) -> AsyncEngine:
    """The sessions' engine with every connection in autocommit (its pool shared): for
    a write that is one statement, which is then its own transaction without a BEGIN
    and a COMMIT round trip each (`services.tasks.step_rows`)."""
    engine = _AUTOCOMMIT.get(sessions)
    if engine is None:
        bound = sessions.kw["bind"]
        assert isinstance(bound, AsyncEngine), "sessions are bound to one engine"
        engine = _AUTOCOMMIT[sessions] = bound.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def one_statement(sessions: Sessions) -> Sessions:
    """Sessions like `sessions` whose every statement is its own transaction: for a read, or
    a write of one statement, without the `BEGIN` before it and the `COMMIT` or `ROLLBACK`
    after it (two of a one-statement transaction's three round trips). A read sees what it
    would in a transaction: under READ COMMITTED each statement takes its own snapshot
    either way. Never for writes that must commit together, nor a lock held between two
    statements."""
    made = _ONE_STATEMENT.get(sessions)
    if made is None:
        made = _ONE_STATEMENT[sessions] = async_sessionmaker(
            autocommit(sessions), expire_on_commit=False
        )
    return made


async def db_now(session: AsyncSession) -> datetime:
    """Postgres's clock (its transaction's start): what a time written by one host and
    compared by another (a lease's end, a retry's due time) is measured on, since no two
    hosts' clocks agree to the second."""
    now = await session.scalar(select(func.now()))
    assert isinstance(now, datetime)
    return now
