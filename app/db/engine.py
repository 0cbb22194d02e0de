"""The async engine and session factory; nothing else."""

from __future__ import annotations

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
