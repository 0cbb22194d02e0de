"""Run `sandhive serve` and `sandhive worker` as real subprocesses for end-to-end tests.

They are children of the zygote (tests/support/zygote.py): the real command, without
paying for its imports each time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from app.config import Settings
from tests.support.zygote import AppProcess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a subprocess read exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, list):  # list settings read "a,b" from the environment
            value = ",".join(map(str, value))
        env[f"SANDHIVE_{name.upper()}"] = str(value)
    return env


def run_app(
    *args: str | Path, env: Mapping[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m app ARGS` (the `sandhive` command) run to its end, its output as text.

    Like `subprocess.run(..., capture_output=True, text=True, timeout=timeout)`: past the
    timeout the command is killed and `TimeoutExpired` raised.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = AppProcess([str(a) for a in args], env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, proc.wait(), _text(out), _text(err))


def _text(output: IO[bytes]) -> str:
    """What `text=True` makes of a captured stream: UTF-8, universal newlines."""
    output.seek(0)
    return output.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def api_key(settings: Settings, tenant: str, cwd: Path) -> str:
    """A new API key of `tenant`, made by `sandhive keys create` on these settings' database."""
    made = run_app("keys", "create", "--tenant", tenant, env=settings_env(settings), cwd=cwd)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@dataclass
class Service:
    base_url: str
    api: AppProcess
    worker: AppProcess
    log_dir: Path

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log")))


def _spawn(args: list[str], env: dict[str, str], log: Path) -> AppProcess:
    with log.open("wb") as out:
        return AppProcess(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(base_url: str, proc: AppProcess, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"API exited early:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"API not ready after 30 s:\n{log.read_text(errors='replace')}")


def _stop(proc: AppProcess) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running_service(settings: Settings, log_dir: Path) -> Iterator[Service]:
    """API and one worker as subprocesses, stopped (SIGTERM, then SIGKILL) afterwards."""
    env = settings_env(settings)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    api_log, worker_log = log_dir / "api.log", log_dir / "worker.log"
    api = _spawn(["serve", "--port", str(port)], env, api_log)
    worker = _spawn(["worker"], env, worker_log)
    try:
        _wait_ready(base_url, api, api_log)
        yield Service(base_url=base_url, api=api, worker=worker, log_dir=log_dir)
    finally:
        _stop(worker)
        _stop(api)


@contextmanager
def keyed_service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    """`running_service` with API keys on (`api_key` makes one), its logs in tmp_path/logs."""
    logs = tmp_path / "logs"
    logs.mkdir()
    with running_service(settings.model_copy(update={"auth": "keys"}), logs) as service:
        yield service


@contextmanager
def ready_worker(settings: Settings, log: Path, within_s: float = 60.0) -> Iterator[AppProcess]:
    """A `sandhive worker` process that has logged "ready"; killed afterwards if still running."""
    worker = _spawn(["worker"], settings_env(settings), log)
    try:
        deadline = time.monotonic() + within_s
        while "ready with" not in log.read_text(errors="replace"):
            assert worker.poll() is None, f"the worker exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the worker never got ready:\n{log.read_text()}"
            time.sleep(0.02)
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
