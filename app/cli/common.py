"""What every `sandhive` command shares: one way to fail, one way to reach Postgres and Redis.

So `keys`, `admin` and `migrate` exit alike: 2 for input the service refuses as
invalid, 1 for any other refusal or a server that cannot be reached (saying which,
and which setting points at it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from redis.exceptions import RedisError
from sqlalchemy.exc import InterfaceError, OperationalError

from app.config import Settings
from app.errors import AppError
from app.resources import Resources, open_resources

_T = TypeVar("_T")
UNREACHABLE = (OSError, OperationalError, InterfaceError)
"""What Postgres being down or unreachable raises (asyncpg, through SQLAlchemy)."""


def fail(message: str, *, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def call(use: Callable[[Resources], Awaitable[_T]], settings: Settings | None = None) -> _T:
    """Run one use case with the process's resources open, failing as every command does."""
    settings = settings or Settings()

    async def _go() -> _T:
        async with open_resources(settings) as res:
            return await use(res)

    try:
        return asyncio.run(_go())
    except AppError as exc:
        fail(exc.message, code=2 if exc.status == 422 else 1)
    except RedisError as exc:
        fail(f"cannot reach Redis ({exc}): is it running at SANDHIVE_REDIS_URL?")
    except UNREACHABLE as exc:
        fail(unreachable_postgres(exc))


def unreachable_postgres(exc: BaseException) -> str:
    return f"cannot reach Postgres ({exc}): is it running at SANDHIVE_DATABASE_URL?"


def warn_without_model(settings: Settings, command: str) -> None:
    """Say at start-up what to set when no real model is configured."""
    import logging

    notice = settings.no_model_notice()
    if notice is not None:
        logging.getLogger("app.cli").warning("sandhive %s: %s", command, notice)


CHECKOUT = Path(__file__).resolve().parents[2]
"""The Sandhive checkout (or installed tree) this command runs from."""


def find_in_checkout(name: str) -> Path:
    for candidate in (Path.cwd() / name, CHECKOUT / name):
        if candidate.exists():
            return candidate
    raise typer.BadParameter(f"cannot find {name} (run from the Sandhive checkout)")
