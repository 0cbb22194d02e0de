"""A redis-server of a test's own, on a free loopback port: to kill, restart or flush freely.

Fault tests restart it; worker and bus tests use one so that nothing else
flushing the shared test database (Redis DB 15) can disturb them.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.processes import free_port


class PrivateRedis:
    """A redis-server of our own on a free loopback port, without persistence."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = log_dir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (apt-get install redis-server)"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--protected-mode", "yes"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"private redis did not start:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: everything in memory is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)


@contextmanager
def running_redis(log_dir: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(log_dir)
    server.start()
    try:
        yield server
    finally:
        server.kill()
