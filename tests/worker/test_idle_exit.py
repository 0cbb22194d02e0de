"""An idle `sandhive worker` exits within a second of SIGTERM, wherever its loop is.

Real process, Postgres, Redis and Docker. An idle worker spends its time in a
blocking read of the queue, and a stop waits for the read in flight: that read
used to block for a second, and the interpreter's last garbage collection added
a few hundred ms on top. Signals land at several points of the loop's cycle.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from app.config import Settings
from tests.support.processes import ready_worker

EXIT_WITHIN_S = 1.0
START_WITHIN_S = 60.0
HANG_S = 30.0


@pytest.mark.parametrize("idle_s", [1.05, 1.3, 1.55, 1.8])
def test_an_idle_worker_exits_within_a_second_of_sigterm(
    settings: Settings, tmp_path: Path, idle_s: float
) -> None:
    log = tmp_path / "worker.log"
    with ready_worker(settings, log, START_WITHIN_S) as worker:
        time.sleep(idle_s)  # idle: no task was ever queued
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM did not end the worker in {HANG_S} s:\n{log.read_text()}")
        took = time.monotonic() - signalled
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert took < EXIT_WITHIN_S, f"an idle worker took {took:.2f} s to exit:\n{text}"
