"""First use: the start-up warning without a real model, and who turns the scripted profile on.

`make run` turns the scripted demo profile on; the settings' default, the compose
deployment and deploy/env.example keep it off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
import uvloop
from typer.testing import CliRunner

from app import logs
from app.cli import main as cli
from app.config import NO_MODEL_NOTICE, SCRIPTED_ONLY_NOTICE, Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No SANDHIVE_* variable and no .env: what a fresh checkout starts with."""

    for name in [n for n in os.environ if n.startswith("SANDHIVE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logs, "setup", lambda *args, **kwargs: None)  # keep pytest's handlers
    return monkeypatch


class FakeWorker:
    seen: ClassVar[list[Settings]] = []
    loops: ClassVar[list[type[asyncio.AbstractEventLoop]]] = []

    def __init__(self, settings: Settings, readiness: Any = None) -> None:
        FakeWorker.seen.append(settings)

    def install_signal_handlers(self) -> None:
        pass

    async def run(self, *, burst: bool = False) -> None:
        FakeWorker.loops.append(type(asyncio.get_running_loop()))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_serve_warns_at_start_up_when_no_real_model_is_configured(
    bare_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import uvicorn

    bare_env.setattr(uvicorn, "run", lambda *args, **kwargs: None)
    result = CliRunner().invoke(cli.cli, ["serve"])
    assert result.exit_code == 0, result.output
    assert warnings_of(caplog) == [f"sandhive serve: {NO_MODEL_NOTICE}"]

    caplog.clear()
    bare_env.setenv("SANDHIVE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    assert CliRunner().invoke(cli.cli, ["serve"]).exit_code == 0
    assert warnings_of(caplog) == [], "a real model: nothing to say"


def test_worker_warns_and_serves_the_scripted_profile_itself(
    bare_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import app.worker.pool

    bare_env.setattr(app.worker.pool, "Worker", FakeWorker)
    FakeWorker.seen.clear()
    assert CliRunner().invoke(cli.cli, ["worker", "--burst"]).exit_code == 0
    assert warnings_of(caplog) == [f"sandhive worker: {NO_MODEL_NOTICE}"]
    assert FakeWorker.seen[-1].llm_profiles() == {}

    caplog.clear()
    bare_env.setenv("SANDHIVE_SCRIPTED_PROFILE", "true")
    assert CliRunner().invoke(cli.cli, ["worker", "--burst"]).exit_code == 0
    assert warnings_of(caplog) == [f"sandhive worker: {SCRIPTED_ONLY_NOTICE}"]
    scripted = FakeWorker.seen[-1].llm_profiles()["scripted"]
    assert scripted.scripted
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", scripted.base_url), "its own server"


def test_the_worker_runs_on_uvloop_unless_told_asyncio(bare_env: pytest.MonkeyPatch) -> None:
    import app.worker.pool

    bare_env.setattr(app.worker.pool, "Worker", FakeWorker)
    FakeWorker.loops.clear()
    assert CliRunner().invoke(cli.cli, ["worker", "--burst"]).exit_code == 0
    bare_env.setenv("SANDHIVE_WORKER_EVENT_LOOP", "asyncio")
    assert CliRunner().invoke(cli.cli, ["worker", "--burst"]).exit_code == 0
    default, told = FakeWorker.loops
    assert issubclass(default, uvloop.Loop)
    assert not issubclass(told, uvloop.Loop)
    assert told.__module__.startswith("asyncio.")


def test_the_scripted_profile_is_off_by_default_and_in_the_deployment(
    bare_env: pytest.MonkeyPatch,
) -> None:
    assert Settings().scripted_profile is False
    assert "scripted" not in Settings().llm_profiles()
    for deployment in ("docker-compose.yml", "deploy/env.example"):
        assert "SCRIPTED_PROFILE" not in (ROOT / deployment).read_text(), deployment


def test_make_run_turns_the_scripted_profile_on() -> None:
    makefile = (ROOT / "Makefile").read_text()
    run = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "SANDHIVE_SCRIPTED_PROFILE=${SANDHIVE_SCRIPTED_PROFILE:-true}" in run.replace("$$", "$")
    assert "sandhive worker" in run
    assert "sandhive serve" in run
