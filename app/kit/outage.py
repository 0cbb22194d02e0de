"""Which failures mean "Postgres or Redis is unreachable", so the API answers 503, not 500.

The drivers report an outage in many forms: SQLAlchemy wraps asyncpg's errors
(`DBAPIError`, with `connection_invalidated` when the connection died; the app
never calls asyncpg itself) but lets an `OSError` from connecting (refused,
reset, DNS, timeout) through as it is; Postgres itself refuses with SQLSTATE
class 08 (connection), 57P01-57P03 (shutting down, starting up) or 53300 (too
many connections); SQLAlchemy's pool times out when no connection frees up;
redis-py raises its `ConnectionError` or `TimeoutError`. `backend_down` names
the backend behind such a failure (None for anything else: a bug stays a 500),
and `unavailable` turns it into the domain error the API answers with (503 +
Retry-After; WebSocket close 1013).
"""

from __future__ import annotations

from typing import Literal

import redis.exceptions
import sqlalchemy.exc

from app.errors import DatabaseUnavailable, RedisUnavailable, Unavailable

Backend = Literal["postgres", "redis"]

LIBRARY_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy.exc.SQLAlchemyError,
    redis.exceptions.RedisError,
    OSError,
)
"""The exception bases an outage arrives as: the ones the API's error handler looks at."""

_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
"""Admin or crash shutdown, cannot connect now (starting or stopping), too many connections."""
_DRIVERS: dict[str, Backend] = {"asyncpg": "postgres", "sqlalchemy": "postgres", "redis": "redis"}
_MAX_CHAIN = 8


def backend_down(exc: BaseException) -> Backend | None:
    """The backend `exc` says is unreachable, or None when it is some other failure."""
    links = _chain(exc)
    for link in links:
        if isinstance(link, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return "redis"
        if _postgres_down(link):
            return "postgres"
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError) and any(
        isinstance(link, OSError) for link in links
    ):
        return "postgres"  # a database error caused by the network
    if isinstance(exc, OSError):  # raw from a driver's connect: which driver raised it?
        return _raised_in(exc)
    return None


def unavailable(exc: BaseException, retry_after_s: int) -> Unavailable | None:
    """The 503 to answer for `exc`, or None when it is not an outage."""
    backend = backend_down(exc)
    if backend == "postgres":
        message = f"the database is unreachable: retry after {retry_after_s} s"
        return DatabaseUnavailable(message, retry_after_s)
    if backend == "redis":
        return RedisUnavailable(
            f"Redis is unreachable: retry after {retry_after_s} s", retry_after_s
        )
    return None


def _postgres_down(link: BaseException) -> bool:
    if isinstance(link, sqlalchemy.exc.DBAPIError) and link.connection_invalidated:
        return True
    if isinstance(link, sqlalchemy.exc.TimeoutError):  # no pooled connection freed up in time
        return True
    sqlstate = getattr(link, "sqlstate", None)  # asyncpg's errors and SQLAlchemy's adapted ones
    return isinstance(sqlstate, str) and (sqlstate.startswith("08") or sqlstate in _SQLSTATES)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc, then what each link wraps (SQLAlchemy's `orig`, else the explicit cause)."""
    links: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in links and len(links) < _MAX_CHAIN:
        links.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return links


def _raised_in(exc: BaseException) -> Backend | None:
    """The backend whose driver the exception came through (the innermost driver frame)."""
    found: Backend | None = None
    tb = exc.__traceback__
    while tb is not None:
        package = str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
        found = _DRIVERS.get(package, found)
        tb = tb.tb_next
    return found
