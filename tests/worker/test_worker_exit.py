"""SIGTERM ends an idle `sandhive worker` at once, however soon after its start it comes.

Real process, Postgres, Redis and Docker. A worker stopped a few milliseconds
after "ready" used to hang until SIGKILL, about one time in ten inside the
end-to-end suite (its first heartbeat swallowed the cancel). That race is
timing-bound and rarely met here; tests/kit/test_periodic.py shows its cause
deterministically, and this test holds the whole process to a prompt exit at
several points of its first moments.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from app.config import Settings
from tests.support.processes import ready_worker

EXIT_WITHIN_S = 10.0
"""Far above a clean idle exit (well under a second), far below the 30 s grace."""
START_WITHIN_S = 60.0


@pytest.mark.parametrize("after_ready_s", [0.0, 0.002, 0.01])
def test_sigterm_soon_after_start_ends_the_worker(
    settings: Settings, tmp_path: Path, after_ready_s: float
) -> None:
    log = tmp_path / "worker.log"
    with ready_worker(settings, log, START_WITHIN_S) as worker:
        time.sleep(after_ready_s)
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM did not end the worker in {EXIT_WITHIN_S} s:\n{log.read_text()}")
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert "stopped" in text, text
