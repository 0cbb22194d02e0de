"""Round trips to Postgres from this process, counted: what a request costs the database,
so that a change adding one to a hot path shows in a test (counts, not times)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import ConnectionPoolEntry, Pool


class PostgresTrips:
    """Every statement SQLAlchemy sends, and every one asyncpg sends as a plain query
    (`BEGIN`, `COMMIT`, `ROLLBACK`, the pool's `SELECT 1` ping), of the connections opened
    while counting: one round trip each."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        self.sent.append(" ".join(statement.split()))

    def connected(self, dbapi_connection: Any, _entry: ConnectionPoolEntry) -> None:
        dbapi_connection.driver_connection.add_query_logger(self.plain)

    def plain(self, logged: Any) -> None:
        self.sent.append(str(logged.query).strip().rstrip(";"))

    def taken(self) -> list[str]:
        """What was sent since the last call."""
        taken, self.sent = self.sent, []
        return taken


@contextmanager
def counting_postgres_trips() -> Iterator[PostgresTrips]:
    """Count from here: only connections opened inside are seen (open the engine after)."""
    trips = PostgresTrips()
    event.listen(Engine, "before_cursor_execute", trips.statement)
    event.listen(Pool, "connect", trips.connected)
    try:
        yield trips
    finally:
        event.remove(Pool, "connect", trips.connected)
        event.remove(Engine, "before_cursor_execute", trips.statement)
