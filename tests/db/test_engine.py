"""The engine's pool on real Postgres: a connection that died while pooled is replaced
before it is lent (`app.db.engine._ping`), the ping is one round trip, not three, and a
connection given back a moment ago is lent without one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from app.db.engine import Sessions, create_engine, create_sessions
from app.kit.outage import backend_down


def plain_url(database_url: str) -> str:
    return database_url.replace("postgresql+asyncpg://", "postgresql://")


async def test_a_connection_killed_in_the_pool_is_replaced_before_use(clean_db: str) -> None:
    async with pool_of_one(clean_db, ping_bypass_s=0.0) as sessions:  # always pinged
        pid = await backend_pid(sessions)
        await terminate(clean_db, pid)
        assert await backend_pid(sessions) != pid  # a new connection, no error for the caller


async def test_one_killed_right_after_its_use_is_one_outage_error_then_replaced(
    clean_db: str,
) -> None:
    """Within the bypass of its return a connection is lent unpinged: if it died
    meanwhile, its caller gets the driver's error, an outage (503 in the API), and the
    next caller a new connection."""
    async with pool_of_one(clean_db, ping_bypass_s=60.0) as sessions:  # however slow the kill
        pid = await backend_pid(sessions)
        await terminate(clean_db, pid)
        with pytest.raises(DBAPIError) as failed:
            await backend_pid(sessions)
        assert backend_down(failed.value) == "postgres", repr(failed.value)
        assert await backend_pid(sessions) != pid


@asynccontextmanager
async def pool_of_one(database_url: str, *, ping_bypass_s: float) -> AsyncIterator[Sessions]:
    engine = create_engine(database_url, pool_size=1, ping_bypass_s=ping_bypass_s)
    try:
        yield create_sessions(engine)
    finally:
        await engine.dispose()


async def backend_pid(sessions: Sessions) -> int:
    async with sessions() as session:
        pid: int = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    return pid


async def terminate(database_url: str, pid: int) -> None:
    """End a backend, as a Postgres restart or an idle timeout would."""
    killer = await asyncpg.connect(plain_url(database_url))
    try:
        assert await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await killer.close()


async def test_a_new_connection_that_fails_at_once_is_an_outage_to_its_caller(
    clean_db: str,
) -> None:
    """A connection opened for the checkout is not pinged (as `pool_pre_ping` pings none):
    when it dies at once (PgBouncer accepting a login for a server that is gone), the
    caller's statement fails with the driver's error, which the API answers as 503
    `database_unavailable`, not a ping's `InvalidRequestError` that it would answer 500."""
    engine = create_engine(clean_db, pool_size=1)
    event.listen(engine.sync_engine, "connect", lambda conn, _: conn.driver_connection.terminate())
    sessions = create_sessions(engine)
    try:
        with pytest.raises(DBAPIError) as failed:
            async with sessions() as session:
                await session.execute(text("SELECT 1"))
        assert backend_down(failed.value) == "postgres", repr(failed.value)
    finally:
        await engine.dispose()


async def test_the_ping_is_one_query_outside_a_transaction_and_only_after_idling(
    clean_db: str,
) -> None:
    """What reaches Postgres for one checkout: the ping alone, no BEGIN/ROLLBACK around it;
    and none at all when the connection was given back within the bypass."""
    # The ping on its own; `pool_pre_ping` would have sent BEGIN, ";", ROLLBACK first.
    assert await second_checkout(clean_db, ping_bypass_s=0.0) == ["SELECT 1", "BEGIN;", "ROLLBACK;"]
    assert await second_checkout(clean_db, ping_bypass_s=60.0) == ["BEGIN;", "ROLLBACK;"]


async def second_checkout(database_url: str, *, ping_bypass_s: float) -> list[str]:
    """What asyncpg sends as plain queries for a session on a connection just given back."""
    sent: list[str] = []

    def log(record: Any) -> None:
        sent.append(record.query)

    async with pool_of_one(database_url, ping_bypass_s=ping_bypass_s) as sessions:
        async with sessions() as session:
            await session.execute(text("SELECT 1"))  # the pool now holds one connection
            raw = await (await session.connection()).get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            driver.add_query_logger(log)
        await asyncio.sleep(0.1)  # asyncpg calls its query loggers from the event loop
        sent.clear()  # the first session's end
        async with sessions() as session:
            await session.execute(text("SELECT 2"))
        await asyncio.sleep(0.1)
    return sent


def test_the_pool_has_no_pre_ping_of_its_own() -> None:
    """`pool_pre_ping` on top of `_ping` would add its three round trips back."""
    engine = create_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    assert not engine.sync_engine.pool._pre_ping
