"""The migrations build exactly the models' schema, and can be undone and redone."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import asyncpg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import Base
from tests.conftest import ADMIN_URL
from tests.support.database import alembic_config, create_database, drop_database, upgrade_to_head

MODEL_TABLES = {
    "tasks",
    "task_inputs",
    "steps",
    "events",
    "artifacts",
    "api_keys",
    "experiments",
    "experiment_items",
    "experiment_rows",
    "experiment_events",
    "episodes",
    "webhook_subscriptions",
    "webhook_deliveries",
    "sandboxes",
    "sandbox_commands",
    "image_builds",
    "step_snapshots",
}


@pytest.fixture
def empty_database_url() -> Iterator[str]:
    """A database of its own with nothing in it, dropped afterwards."""
    name = f"sandhive_migrations_{os.getpid()}"
    asyncio.run(create_database(ADMIN_URL, name))
    yield ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    asyncio.run(drop_database(ADMIN_URL, name))


def asyncpg_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+asyncpg://")


async def fetch_names(url: str, sql: str) -> set[str]:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        return {row[0] for row in await conn.fetch(sql)}
    finally:
        await conn.close()


def tables(url: str) -> set[str]:
    sql = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    return asyncio.run(fetch_names(url, sql))


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    url = asyncpg_url(empty_database_url)
    assert tables(url) == set()

    upgrade_to_head(url)
    assert tables(url) == MODEL_TABLES | {"alembic_version"}

    command.downgrade(alembic_config(url), "base")
    assert tables(url) == {"alembic_version"}

    upgrade_to_head(url)
    assert tables(url) == MODEL_TABLES | {"alembic_version"}


def test_experiment_rows_downgrade_gives_every_item_its_row_back(empty_database_url: str) -> None:
    """This release stores a row once (`experiment_rows`), an earlier one a copy per item:
    undoing the migration copies each row back onto its items, or the earlier release
    would find items without a row."""
    url = asyncpg_url(empty_database_url)
    upgrade_to_head(url)
    row = '{"id": "q1", "problem_statement": "p", "ground_truth": "1"}'

    async def fill() -> None:
        conn = await asyncpg.connect(empty_database_url)
        try:
            await conn.execute(
                "INSERT INTO experiments (id, tenant_id, name, status, spec, metadata, "
                "created_at, event_seq) VALUES ('exp_m', 't', 'm', 'running', '{}', '{}', "
                "now(), 0)"
            )
            await conn.execute(
                "INSERT INTO experiment_rows (experiment_id, row_id, row) "
                "VALUES ('exp_m', 'q1', $1)",
                row,
            )
            await conn.executemany(
                "INSERT INTO experiment_items (experiment_id, row_id, arm, attempt, seq, status, "
                "detail, prompt_tokens, completion_tokens, steps, seconds, updated_at, "
                "scoring_claims, gradings) VALUES ('exp_m', 'q1', $1, 1, $2, 'pending', '{}', "
                "0, 0, 0, 0, now(), 0, '[]')",
                [("a", 0), ("b", 1)],
            )
        finally:
            await conn.close()

    asyncio.run(fill())
    command.downgrade(alembic_config(url), "f7c3d9a1b2e4")
    (found,) = asyncio.run(
        fetch_names(empty_database_url, "SELECT row::text FROM experiment_items")
    )
    assert json.loads(found) == json.loads(row)
    nulls = "SELECT count(*)::text FROM experiment_items WHERE row IS NULL"
    assert asyncio.run(fetch_names(empty_database_url, nulls)) == {"0"}
    assert "experiment_rows" not in tables(url)


def test_migrations_create_every_model_table() -> None:
    assert set(Base.metadata.tables) == MODEL_TABLES


async def test_models_match_migrated_database(database_url: str) -> None:
    """Autogenerate finds nothing to do: the models and the migrations agree."""

    def diff(conn: Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


async def test_constraint_names_follow_the_naming_convention(database_url: str) -> None:
    expected = {
        str(constraint.name)
        for table in Base.metadata.tables.values()
        for constraint in [*table.constraints, *table.indexes]
    }
    in_database = await fetch_names(
        database_url,
        "SELECT conname FROM pg_constraint JOIN pg_namespace n ON n.oid = connamespace"
        " WHERE n.nspname = 'public'"
        " UNION SELECT indexname FROM pg_indexes WHERE schemaname = 'public'",
    )
    assert {"pk_tasks", "fk_steps_task_id", "uq_tasks_tenant_idempotency"} <= expected
    assert expected <= in_database
