"""Every command that needs Postgres or Redis fails alike when one cannot be reached."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli.main import cli

NOWHERE = {
    "SANDHIVE_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
    "SANDHIVE_REDIS_URL": "redis://127.0.0.1:1/0",
}


@pytest.mark.parametrize(
    ("args", "which", "setting"),
    [
        (["keys", "list"], "Postgres", "SANDHIVE_DATABASE_URL"),
        (["keys", "revoke", "key_0000000000000000"], "Postgres", "SANDHIVE_DATABASE_URL"),
        (["admin", "requeue", "tsk_x"], "Postgres", "SANDHIVE_DATABASE_URL"),
        (["admin", "prune"], "Postgres", "SANDHIVE_DATABASE_URL"),
        (["admin", "workers"], "Redis", "SANDHIVE_REDIS_URL"),
        (["admin", "drain", "w1"], "Redis", "SANDHIVE_REDIS_URL"),
        (["migrate"], "Postgres", "SANDHIVE_DATABASE_URL"),
    ],
)
def test_an_unreachable_server_exits_1_saying_which_and_where(
    args: list[str], which: str, setting: str
) -> None:
    done = CliRunner().invoke(cli, args, env=NOWHERE)
    assert done.exit_code == 1, done.output
    assert f"error: cannot reach {which}" in done.output
    assert setting in done.output
    assert "Traceback" not in done.output
