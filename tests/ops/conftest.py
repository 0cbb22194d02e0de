"""Fixtures for the operations tests: sessions on the clean session database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.engine import create_engine, create_sessions


@pytest.fixture
async def sessions(clean_db: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(clean_db)
    yield create_sessions(engine)
    await engine.dispose()
