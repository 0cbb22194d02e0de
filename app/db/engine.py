"""The async engine and session factory, and the one clock every process shares."""

from __future__ import annotations

import weakref
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

Sessions = async_sessionmaker[AsyncSession]
"""The session factory every use case receives."""


POOL_SIZE = 5
"""SQLAlchemy's default: connections kept open between uses."""


def create_engine(database_url: str, *, pool_size: int = POOL_SIZE) -> AsyncEngine:
    """`pool_size` connections are kept; up to 10 more are opened when busy, and closed as
    soon as they are returned: a pool smaller than what runs at once costs a connect (and
    a Postgres backend's fork) per transaction."""
    return create_async_engine(
        database_url, pool_pre_ping=True, pool_size=pool_size, max_overflow=10
    )


def create_sessions(engine: AsyncEngine) -> Sessions:
    # expire_on_commit=False: async code cannot lazy-load an expired attribute.
    return async_sessionmaker(engine, expire_on_commit=False)


_AUTOCOMMIT: weakref.WeakKeyDictionary[Sessions, AsyncEngine] = weakref.WeakKeyDictionary()


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


async def db_now(session: AsyncSession) -> datetime:
    """Postgres's clock (its transaction's start): what a time written by one host and
    compared by another (a lease's end, a retry's due time) is measured on, since no two
    hosts' clocks agree to the second."""
    now = await session.scalar(select(func.now()))
    assert isinstance(now, datetime)
    return now
