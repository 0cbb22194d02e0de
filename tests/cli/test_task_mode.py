"""A task's `mode` as clients see it (TaskOut), and `sandhive run --mode vanilla`: one call of
the scripted model, no sandbox, its reply the answer."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.api.app import create_app
from app.cli.main import cli
from app.config import Settings
from app.db.engine import Sessions
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import serve
from tests.support.rows import insert_task


async def test_task_out_says_its_mode(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    old = await insert_task(sessions)  # a spec stored before the field existed: no `mode`
    async with serve(create_app(make_settings())) as client:
        vanilla = await client.post("/v1/tasks", json={"prompt": "p", "mode": "vanilla"})
        sandbox = await client.post("/v1/tasks", json={"prompt": "p"})
        assert (vanilla.status_code, sandbox.status_code) == (202, 202), vanilla.text
        assert (vanilla.json()["mode"], sandbox.json()["mode"]) == ("vanilla", "sandbox")
        read = (await client.get(f"/v1/tasks/{vanilla.json()['id']}")).json()
        assert read["mode"] == "vanilla"
        listed = {t["id"]: t["mode"] for t in (await client.get("/v1/tasks")).json()["items"]}
    assert listed == {vanilla.json()["id"]: "vanilla", sandbox.json()["id"]: "sandbox"} | {
        old: "sandbox"
    }


def run_args(scripted_llm: ScriptedLLMServer, model: str, tmp_path: Path) -> list[str]:
    return [
        "run",
        "--prompt",
        "What is 6 * 7?",
        "--base-url",
        scripted_llm.base_url,
        "--model",
        model,
        "--output-dir",
        str(tmp_path),
    ]


def test_sandhive_run_mode_vanilla_is_one_call_without_a_sandbox(
    scripted_llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDHIVE_SANDBOX_IMAGE", "sandhive-no-such-image:never")  # not needed
    monkeypatch.setenv("COLUMNS", "120")
    model = f"vanilla-run-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(model, Script(turns=[Turn(content="It is 42.")], tools="none"))
    args = run_args(scripted_llm, model, tmp_path)
    done = CliRunner().invoke(cli, [*args, "--mode", "vanilla"])
    assert done.exit_code == 0, done.output
    assert "finish_reason: submitted (1 steps)" in done.output
    assert "answer: It is 42." in done.output
    assert scripted_llm.requests[model] == 1
    body = scripted_llm.last_request(model) or {}
    assert "tools" not in body, "a vanilla call offers no tools"
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert [f for f in scripted_llm.failures if f.startswith(model)] == []
    [run_dir] = list(tmp_path.iterdir())
    assert (run_dir / "files" / "answer.txt").read_text() == "It is 42."


def test_sandhive_run_refuses_tools_or_a_bad_mode_for_vanilla(
    scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    args = run_args(scripted_llm, "unused", tmp_path)
    tools = CliRunner().invoke(cli, [*args, "--mode", "vanilla", "--tools-profile", "reference"])
    assert tools.exit_code == 2
    assert "leave tools out" in tools.output
    odd = CliRunner().invoke(cli, [*args, "--mode", "both"])
    assert odd.exit_code == 2
    assert "mode" in odd.output
