"""A PostgreSQL server of a test's own, on a free loopback port: to stop and start freely.

Outage tests stop it under a running API and worker and start it again; the
machine's main server is never touched. The cluster lives in a throwaway
directory outside pytest's tmp tree (which only root may enter): when the test
runs as root, `initdb` and `pg_ctl` run as the `postgres` user, who must own it.
Trust auth on 127.0.0.1 only, no fsync: it is a test's scratch server.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.database import create_database, upgrade_to_head
from tests.support.processes import free_port

SERVER_USER = "postgres"
START_TIMEOUT_S = 30


def _bin_dir() -> Path:
    """The newest installed server's binaries (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    assert on_path, "PostgreSQL server binaries not found (apt-get install postgresql)"
    return Path(on_path).parent


class PrivatePostgres:
    """initdb once; then start, stop and start again on the same port and data."""

    def __init__(self) -> None:
        self.port = free_port()
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="sandhive-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of one database on this server."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def start(self) -> None:
        """Start and wait until it accepts connections (`pg_ctl -w`)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )

    def stop(self) -> None:
        """Fast shutdown: open connections are ended, the server is gone when this returns."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        status = self._command("pg_ctl", "-D", str(self.data), "status")
        return subprocess.run(status, capture_output=True, check=False).returncode == 0

    def remove(self) -> None:
        if self.data.exists() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _command(self, program: str, *args: str) -> list[str]:
        command = [str(self.bin / program), *args]
        return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            self._command(program, *args), capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr}\n{log}")


@contextmanager
def running_postgres(database: str) -> Iterator[tuple[PrivatePostgres, str]]:
    """A started private server with `database` created and migrated to head; its URL."""
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        asyncio.run(create_database(server.admin_url, database))
        url = server.url(database)
        upgrade_to_head(url)
        yield server, url
    finally:
        server.remove()
