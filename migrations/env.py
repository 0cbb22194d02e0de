"""Alembic environment: runs migrations over asyncpg against Sandhive's metadata.

Imports from app only `app.db.models` (the metadata) and `app.config` (the
URL when the caller did not set one).
"""

from __future__ import annotations

import asyncio
import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.config import Settings
from app.db.models import Base

config = context.config
MIGRATE_LOCK = 0x5A_4E_D1_0E_0001
"""Postgres advisory lock key held while migrating (any fixed bigint, unique to Sandhive)."""
target_metadata = Base.metadata

# Configure logging only when nobody has yet (the alembic CLI); tests and the
# app's own CLI keep their handlers.
if config.config_file_name is not None and not logging.getLogger().handlers:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The caller's URL if it set one, else the server's configured database."""
    return config.get_main_option("sqlalchemy.url") or Settings().database_url


def run_migrations_offline() -> None:
    """Emit SQL to stdout (`alembic upgrade --sql`) without connecting."""
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    """Migrate under a transaction-scoped advisory lock.

    Several replicas may run `sandhive migrate` at once (every host's entrypoint,
    compose's one-shot service): the first migrates, the others wait for its
    commit, then find the schema at head and do nothing, instead of racing to
    create `alembic_version` and the tables.
    """
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK})
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_async_engine(database_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
