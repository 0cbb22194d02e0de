"""The real `sandhive serve` in a subprocess, for security tests that read what it logs.

Imported by tests/security/test_log_redaction.py and test_fuzz.py. No worker:
tasks stay queued. Ready means /healthz answers 200.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.config import Settings
from tests.support.processes import free_port, settings_env
from tests.support.zygote import AppProcess


@contextmanager
def running_api(settings: Settings, log: Path) -> Iterator[str]:
    """`sandhive serve` on a free port, its output in log: the base URL; SIGTERM afterwards."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = AppProcess(
            ["serve", "--port", str(port)],
            env=settings_env(settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(base_url, proc, log)
        yield base_url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def wait_ready(base_url: str, proc: AppProcess, log: Path) -> None:
    """Poll /healthz until it answers; fail with the log if the server dies or never does."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"API not ready:\n{log.read_text(errors='replace')}")
