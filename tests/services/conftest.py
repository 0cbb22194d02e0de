"""Fixtures for service tests: sessions on the clean session database, Settings without Docker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessions
from tests.services.rows import plain_settings


@pytest.fixture
async def sessions(clean_db: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(clean_db)
    yield create_sessions(engine)
    await engine.dispose()


@pytest.fixture
def service_settings(clean_db: str, redis: Redis) -> Settings:
    """Real Postgres and Redis; an LLM profile that is configured but never called."""
    return plain_settings(clean_db)
