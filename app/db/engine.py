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


def create_engine(database_url: str) -> AsyncEngine:
    return create_async_engine(database_url, pool_pre_ping=True)


def create_sessions(engine: AsyncEngine) -> Sessions:
    # expire_on_commit=False: async code cannot lazy-load an expired attribute.
    return async_sessionmaker(engine, expire_on_commit=False)
