"""A child of the zygote is `python -m app` run afresh: its output, status, environment, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import run_app
from tests.support.zygote import AppProcess, Zygote


def fresh(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("args", [["--help"], ["keys", "--help"], ["no-such-command"]])
def test_a_child_says_what_a_fresh_interpreter_says(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "91"}
    child, real = run_app(*args, env=env, cwd=tmp_path), fresh(*args, env=env, cwd=tmp_path)
    assert (child.returncode, child.stdout, child.stderr) == (
        real.returncode,
        real.stdout,
        real.stderr,
    )
    assert "python -m app" in child.stdout + child.stderr  # the program name of `-m app`


def test_a_child_takes_the_environment_and_directory_it_is_given(tmp_path: Path) -> None:
    narrow = run_app("--help", env={**os.environ, "COLUMNS": "60"}, cwd=tmp_path)
    wide = run_app("--help", env={**os.environ, "COLUMNS": "140"}, cwd=tmp_path)
    assert max(map(len, narrow.stdout.splitlines())) <= 60
    assert max(map(len, wide.stdout.splitlines())) > 60
    # A relative path is read from the child's working directory.
    (tmp_path / "tasks").mkdir()
    real = fresh("experiment", "run", "tasks", "--local", env=dict(os.environ), cwd=tmp_path)
    child = run_app("experiment", "run", "tasks", "--local", env=os.environ, cwd=tmp_path)
    assert (child.returncode, child.stderr) == (real.returncode, real.stderr)
    assert "tasks" in child.stderr + child.stdout


def test_a_child_is_its_own_process_and_its_signal_is_its_status(tmp_path: Path) -> None:
    # A worker whose Redis is nowhere keeps trying: it runs until it is told to stop.
    env = {**os.environ, "SANDHIVE_REDIS_URL": "redis://127.0.0.1:9/0"}
    with (tmp_path / "worker.log").open("wb") as log:
        child = AppProcess(["worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    assert child.pid != Zygote.get().proc.pid
    assert Path(f"/proc/{child.pid}/cwd").resolve() == Path.cwd().resolve()
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    time.sleep(1)  # let it get as far as a fresh one would
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    assert child.poll() == -signal.SIGKILL


def test_a_command_that_outlives_its_timeout_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "SANDHIVE_REDIS_URL": "redis://127.0.0.1:9/0"}
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_app("worker", env=env, cwd=tmp_path, timeout=1)
    assert time.monotonic() - started < 30
