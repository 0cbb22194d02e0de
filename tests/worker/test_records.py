"""The records go where people look: an experiment run by a real worker in real sandboxes,
exported as ATIF (validated by the real `harbor` package's models, run from a Python 3.13
root filesystem) and as an Inspect eval log (read back by inspect-ai's own reader, the one
`inspect view` uses).

One arm (`good`) is captured against a trainer's server answering vLLM-style, so its ATIF
steps carry token ids and logprobs; the other (`broken`) calls a model the server does not
know, so every item is an infrastructure failure: not scored, an Inspect sample error.
"""

from __future__ import annotations

import io
import json
import sys
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inspect_ai.log import read_eval_log
from pydantic import SecretStr

from app.api.app import create_app
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import assert_error, serve
from tests.support.experiments import ADMIN_KEY, as_tenant, progress, settled
from tests.support.harbor import atif_problems
from tests.worker.conftest import running_worker

ALICE, BOB = as_tenant("alice"), as_tenant("bob")


@pytest.fixture(scope="module")
def trainer() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def keyed(fast: Settings, trainer: ScriptedLLMServer) -> Settings:
    return fast.model_copy(
        update={
            "llm_allowed_base_urls": [trainer.base_url],
            "auth": "keys",
            "admin_api_key": SecretStr(ADMIN_KEY),
        }
    )


@pytest.fixture
async def api(keyed: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(keyed)) as client:
        client.headers.update(ALICE)
        yield client


@pytest.fixture
async def finished(
    keyed: Settings, api: httpx.AsyncClient, trainer: ScriptedLLMServer
) -> dict[str, Any]:
    """A finished experiment: `good` (2 rows x 2 attempts, 3 right of 4, captured) and
    `broken` (its model unknown to the server: 4 infrastructure failures, no retries)."""
    good = f"records-{uuid.uuid4().hex[:8]}"

    def variant(answer: str) -> list[Turn]:
        command = f"printf '\\\\boxed{{{answer}}}' > /testbed/output/answer.txt"
        return [Turn("execute_bash", {"command": command}, content="Writing."), Turn("submit", {})]

    answers = ("4", "4", "4", "5")  # in start order: q1 a1, q2 a1, q1 a2, q2 a2
    trainer.add_script(good, Script([], session_variants=[variant(a) for a in answers]))
    llm = {"base_url": trainer.base_url, "capture": True}
    body = {
        "name": "records",
        "dataset": {
            "rows": [
                {"id": "q/1", "problem_statement": "2+2?", "ground_truth": "4"},
                {"id": "q2", "problem_statement": "3+1?", "ground_truth": "4"},
            ]
        },
        "arms": [
            {"name": "good", "task": {"llm": {**llm, "model": good}, "limits": {"max_steps": 4}}},
            {"name": "broken", "task": {"llm": {**llm, "model": "no-such-model"}}},
        ],
        "scorer": {"kind": "math"},
        "attempts": 2,
        "concurrency": 4,
        "infrastructure_retries": 0,
    }
    async with running_worker(keyed):
        created = await api.post("/v1/experiments", json=body)
        assert created.status_code == 202, created.text
        url = f"/v1/experiments/{created.json()['id']}"
        done: dict[str, Any] = await settled(api, url, "finished")
    assert done["progress"] == {
        "good": progress(scored=4),
        "broken": progress(error=4, not_scored=4),
    }
    return done


async def jsonl(api: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    response = await api.get(url)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


async def test_an_experiment_exports_as_atif_and_as_inspect_logs(
    api: httpx.AsyncClient, finished: dict[str, Any], tmp_path: Path
) -> None:
    await check_atif(api, finished["id"])
    await check_inspect(api, finished["id"], tmp_path)


async def check_atif(api: httpx.AsyncClient, exp_id: str) -> None:
    """Every task's ATIF (trajectory and export) and the experiment's zip, Harbor-valid."""
    lines = {line["task_id"]: line for line in await jsonl(api, f"/v1/experiments/{exp_id}/export")}
    assert len(lines) == 8

    singles = {}
    for task_id in lines:
        response = await api.get(f"/v1/tasks/{task_id}/trajectory?format=atif")
        assert response.status_code == 200, response.text
        singles[task_id] = response.json()
        exported = await api.get(f"/v1/tasks/{task_id}/export?format=atif")
        assert exported.json() == singles[task_id]

    archive = await api.get(f"/v1/experiments/{exp_id}/export?format=atif")
    assert archive.status_code == 200, archive.text
    assert archive.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(archive.content)) as folder:
        files = {name: json.loads(folder.read(name)) for name in folder.namelist()}
    assert set(files) == {
        f"{exp_id}/{arm}/{row}-{attempt}.json"
        for arm in ("good", "broken")
        for row in ("q_1", "q2")
        for attempt in (1, 2)
    }
    assert sorted(files.values(), key=lambda t: t["session_id"]) == sorted(
        singles.values(), key=lambda t: t["session_id"]
    )

    assert atif_problems(list(singles.values())) == [None] * 8

    for task_id, trajectory in singles.items():
        line = lines[task_id]
        assert trajectory["schema_version"] == "ATIF-v1.7"
        assert trajectory["session_id"] == task_id
        assert trajectory["extra"]["reward"] == line["reward"]
        assert trajectory["extra"]["infrastructure_failure"] is line["infrastructure_failure"]
        steps = trajectory["steps"]
        assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
        if line["arm"] == "broken":
            assert [s["source"] for s in steps] == ["user", "agent"]  # the failed call
            assert "tool_calls" not in steps[1]
            assert steps[1]["extra"] == {"interrupted": "llm_error"}
            continue
        assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
        assert steps[1]["message"] in ("2+2?", "3+1?")
        names = {t["function"]["name"] for t in trajectory["agent"]["tool_definitions"]}
        assert names == {"execute_bash", "str_replace_editor", "submit"}
        first, second = steps[2], steps[3]
        assert first["tool_calls"][0]["function_name"] == "execute_bash"
        assert "boxed" in first["tool_calls"][0]["arguments"]["command"]
        result = first["observation"]["results"][0]
        assert result["source_call_id"] == first["tool_calls"][0]["tool_call_id"]
        assert second["tool_calls"][0]["function_name"] == "submit"
        for step, turn in zip((first, second), line["turns"], strict=True):
            assert step["metrics"]["prompt_token_ids"] == turn["prompt_token_ids"]
            assert step["metrics"]["completion_token_ids"] == turn["completion_token_ids"]
            assert step["metrics"]["logprobs"] == turn["logprobs"]
            assert step["metrics"]["completion_token_ids"]

    broken_one = json.loads(json.dumps(next(iter(singles.values()))))
    broken_one["steps"][0]["step_id"] = 7  # Harbor's models do refuse what is wrong
    assert atif_problems([broken_one])[0] is not None

    one_arm = await api.get(f"/v1/experiments/{exp_id}/export?format=atif&arm=good")
    with zipfile.ZipFile(io.BytesIO(one_arm.content)) as folder:
        assert {name.split("/")[1] for name in folder.namelist()} == {"good"}
    good_lines = await jsonl(api, f"/v1/experiments/{exp_id}/export?arm=good")
    assert {line["arm"] for line in good_lines} == {"good"}
    assert len(good_lines) == 4
    for fmt in ("jsonl", "atif", "inspect"):
        missing = await api.get(f"/v1/experiments/{exp_id}/export?format={fmt}&arm=nope")
        assert_error(missing, 404, "not_found")
    task_id = next(t for t, line in lines.items() if line["arm"] == "good")
    first = await api.get(f"/v1/tasks/{task_id}/trajectory?format=atif&attempt=1")
    assert first.json()["extra"]["worker_attempt"] == 1

    other_task = next(iter(lines))
    for path in (
        f"/v1/tasks/{other_task}/trajectory?format=atif",
        f"/v1/experiments/{exp_id}/export?format=atif",
    ):
        assert_error(await api.get(path, headers=BOB), 404, "not_found")


async def check_inspect(api: httpx.AsyncClient, exp_id: str, tmp_path: Path) -> None:
    """Each arm's Inspect log, as inspect-ai's reader (`inspect view`'s) reads it."""
    url = f"/v1/experiments/{exp_id}/export?format=inspect"
    logs = {}
    for arm in ("good", "broken"):
        response = await api.get(f"{url}&arm={arm}")
        assert response.status_code == 200, response.text
        assert f'filename="{exp_id}-{arm}.eval"' in response.headers["content-disposition"]
        path = tmp_path / f"{arm}.eval"
        path.write_bytes(response.content)
        logs[arm] = read_eval_log(str(path))

    good = logs["good"]
    assert good.status == "success"
    assert good.eval.task == "records/good"
    assert good.eval.dataset.samples == 2
    assert good.samples is not None
    samples = {(s.id, s.epoch): s for s in good.samples}
    assert set(samples) == {("q/1", 1), ("q2", 1), ("q/1", 2), ("q2", 2)}
    rewards = {key: s.scores["math"].value for key, s in samples.items() if s.scores}
    assert sorted(rewards.values()) == [0.0, 1.0, 1.0, 1.0]
    one = samples[("q/1", 1)]
    assert (one.input, one.target) == ("2+2?", "4")
    roles = [m.role for m in one.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert one.messages[2].tool_calls[0].function == "execute_bash"
    assert one.error is None
    assert good.results is not None
    (score,) = good.results.scores
    assert (score.name, score.metrics["mean"].value) == ("math", pytest.approx(0.75))
    assert (score.scored_samples, score.unscored_samples) == (4, 0)

    broken = logs["broken"]
    assert broken.samples is not None
    assert len(broken.samples) == 4
    for sample in broken.samples:
        assert sample.scores is None
        assert sample.error is not None
        assert sample.error.message.startswith("not scored: error (infrastructure)")
    assert broken.results is not None
    (score,) = broken.results.scores
    assert (score.scored_samples, score.unscored_samples) == (0, 4)
    assert score.metrics == {}, "no mean of nothing (a 0 would read as a score)"

    both = await api.get(url)  # no arm, two arms: a zip of both logs
    assert both.status_code == 200, both.text
    assert both.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(both.content)) as folder:
        assert sorted(folder.namelist()) == [f"{exp_id}-broken.eval", f"{exp_id}-good.eval"]
        folder.extractall(tmp_path / "both")
    again = read_eval_log(str(tmp_path / "both" / f"{exp_id}-good.eval"))
    assert again.samples is not None
    assert len(again.samples) == 4
    assert_error(await api.get(f"{url}&arm=nope"), 404, "not_found")
    assert_error(await api.get(f"{url}&arm=good", headers=BOB), 404, "not_found")


async def test_a_server_without_inspect_ai_says_which_extra_to_install(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "inspect_ai.log", None)  # what an absent package raises
    response = await api.get("/v1/experiments/exp-any/export?format=inspect&arm=good")
    assert_error(response, 501, "not_installed")
    assert "sandhive[inspect]" in response.json()["error"]["message"]
