"""`sandhive admin drain NAME` drains live workers only: an unknown name is an error (exit 1).

A mistyped name used to be answered "draining ..." with exit 0, and left a flag
that would stop a later worker of that name at its first heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from redis.asyncio import Redis
from typer.testing import CliRunner

from app.bus import keys, leases
from app.cli.main import cli
from app.config import Settings
from tests.support.processes import settings_env


async def beat(settings: Settings, name: str) -> None:
    client = Redis.from_url(settings.redis_url)
    try:
        await leases.beat(client, name, 10_000, {"host": "h1", "pid": 42, "tasks": 0, "slots": 2})
    finally:
        await client.aclose()


async def flag_set(settings: Settings, name: str) -> bool:
    client = Redis.from_url(settings.redis_url)
    try:
        return bool(await client.exists(keys.drain_flag(name)))
    finally:
        await client.aclose()


def test_draining_an_unknown_worker_fails_and_sets_nothing(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    env = settings_env(settings)
    result = CliRunner().invoke(cli, ["admin", "drain", "w-typo"], env=env)
    assert result.exit_code == 1, result.output
    assert "error: no live worker 'w-typo'" in result.output
    assert "draining" not in result.output
    assert not asyncio.run(flag_set(settings, "w-typo"))

    asyncio.run(beat(settings, "w-live"))
    result = CliRunner().invoke(cli, ["admin", "drain", "w-live"], env=env)
    assert result.exit_code == 0, result.output
    assert "draining w-live" in result.output
    assert asyncio.run(flag_set(settings, "w-live"))
