"""docs/rl.md's worked examples for trainers that own the loop, run as written against a live
service (`sandhive serve` and `sandhive worker` processes): only the server's address is
put in, and `my_policy` (the reader's model) is a policy that writes 42 and submits."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from tests.e2e.fault_harness import Cluster, cluster
from tests.episodes.conftest import tool_turn

RL_DOC = Path(__file__).resolve().parents[2] / "docs" / "rl.md"
DOC_URL = "http://localhost:8000"


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of the docs/rl.md section headed `### {section}`."""
    text = RL_DOC.read_text(encoding="utf-8")
    start = text.index(f"### {section}\n")  # the first: the episodes' section comes first
    ends = [i for i in (text.find("\n### ", start + 1), text.find("\n## ", start)) if i > 0]
    return re.findall(r"```python\n(.*?)```", text[start : min(ends, default=len(text))], re.S)


def my_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the answer on the first turn, submit on the next."""
    assert {t["function"]["name"] for t in tools} >= {"str_replace_editor", "submit"}
    if not any(m["role"] == "assistant" for m in messages):
        args = {"command": "create", "path": "/testbed/output/answer.txt", "file_text": "42"}
        return tool_turn("call_1", "str_replace_editor", args)
    return tool_turn("call_2", "submit", {})


@pytest.fixture
def live(make_episode_settings: Any, tmp_path: Path) -> Iterator[Cluster]:
    """The service with API keys off (the examples' `Bearer sk-...` is then not checked)."""
    settings: Settings = make_episode_settings(auth="disabled")
    with cluster(settings, tmp_path) as procs:
        procs.start_api()
        procs.start_worker("doc-worker")
        log = tmp_path / "doc-worker.log"
        deadline = time.monotonic() + 60
        while not log.exists() or "ready with" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the worker never got ready:\n{procs.logs()}"
            time.sleep(0.05)
        yield procs


def run_block(code: str, base_url: str, **names: Any) -> dict[str, Any]:
    """Run the example with the server's address (host and port, wherever the URL has
    them: `http://trainer:sk-...@localhost:8000` too) put in."""
    host = DOC_URL.removeprefix("http://")
    assert host in code, "the example no longer names the server's address"
    scope: dict[str, Any] = {"my_policy": my_policy, **names}
    code = code.replace(host, base_url.removeprefix("http://"))
    exec(compile(code, str(RL_DOC), "exec"), scope)
    return scope


async def test_the_worked_example_runs_and_rewards_the_answer(live: Cluster) -> None:
    (example,) = python_blocks("Worked example")
    scope = await asyncio.to_thread(run_block, example, live.base_url)
    try:
        check_worked_example(scope)
    finally:
        scope["api"].close()  # the example's client, closed even when a check fails


def check_worked_example(scope: dict[str, Any]) -> None:
    assert scope["done"] is True
    assert (scope["answer"]["finish_reason"], scope["answer"]["error_kind"]) == ("submitted", None)
    assert scope["reward"] == 1.0
    assert [m["role"] for m in scope["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert scope["messages"][3]["content"].endswith("\nSteps Remaining: 19")
    closed = scope["api"].get(f"/v1/episodes/{scope['episode']}").json()
    assert closed["status"] == "closed"


async def test_the_client_example_runs_eight_rollouts_at_once(
    live: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    (example,) = python_blocks("The Python client")
    spec = {
        "prompt": "What is 6 x 7?",
        "limits": {"max_steps": 5},
        "scorer": {"kind": "exact"},
        "ground_truth": "42",
    }
    scope = run_block(example, live.base_url, SPEC=spec)
    await scope["main"]()
    assert capsys.readouterr().out.strip() == str([1.0] * 8)


async def test_the_openenv_example_runs_and_gets_the_reward(
    live: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    (example,) = python_blocks("OpenEnv: `/v1/openenv`")
    await asyncio.to_thread(run_block, example, live.base_url)
    observation, ending = capsys.readouterr().out.strip().rsplit("\n", 1)
    assert observation.startswith("Exit code: 0\n")
    assert observation.endswith("Steps Remaining: 99")
    assert ending == "True 1.0"


async def test_the_skyrl_example_runs_and_gets_the_reward(
    live: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    (example,) = python_blocks("SkyRL-gym's text environment")
    await asyncio.to_thread(run_block, example, live.base_url)
    observations, reward = capsys.readouterr().out.strip().rsplit("\n", 1)
    assert observations.startswith("[{'role': 'user', 'content': 'Exit code: 0")
    assert reward == "1.0"
