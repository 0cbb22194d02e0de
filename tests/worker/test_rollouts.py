"""Rollouts for trainers that own the model, end to end: an experiment with `attempts: 4`
and `llm.capture` on, its arms calling a trainer's own (allowed) model server, run by a
real in-process worker in real sandboxes, exported as JSONL through the API.

The trainer's server is a second scripted server answering vLLM-style (token ids and
logprobs); its session variants make the four rollouts of one group differ
deterministically (3 right, 1 wrong), so every reward, mean, std and advantage below is
known, and every id and logprob is checked against what the server sent that task. One
arm streams its calls, the other does not (a profile with `stream = false`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from app.api.app import create_app
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from app.scripted.tokens import prompt_ids
from tests.api.conftest import assert_error, serve
from tests.support.experiments import ADMIN_KEY, as_tenant, settled
from tests.worker.conftest import running_worker

ALICE, BOB = as_tenant("alice"), as_tenant("bob")
EPS = 1e-6


@pytest.fixture(scope="module")
def trainer() -> Iterator[ScriptedLLMServer]:
    """The trainer's inference server: not the profile's (`scripted_llm`)."""
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def rl(fast: Settings, trainer: ScriptedLLMServer, tmp_path: Path) -> Settings:
    """The trainer's server allowed; a `plain` profile that does not stream (SGLang's way)."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        f'[profiles.plain]\nbase_url = "{fast.llm_base_url}"\nmodel = "unset"\nstream = false\n'
    )
    return fast.model_copy(
        update={
            "llm_allowed_base_urls": [trainer.base_url],
            "llm_profiles_file": profiles,
            "auth": "keys",
            "admin_api_key": SecretStr(ADMIN_KEY),
        }
    )


@pytest.fixture
async def api(rl: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(rl)) as client:
        yield client


def answering(trainer: ScriptedLLMServer, *answers: str) -> str:
    """A model whose n-th rollout writes \\boxed{answers[n % len]} and submits."""

    def variant(answer: str) -> list[Turn]:
        command = f"printf '\\\\boxed{{{answer}}}' > /testbed/output/answer.txt"
        return [Turn("execute_bash", {"command": command}, content="Writing."), Turn("submit", {})]

    name = f"rl-{uuid.uuid4().hex[:8]}"
    trainer.add_script(name, Script([], session_variants=[variant(a) for a in answers]))
    return name


def arm(name: str, model: str, base_url: str, profile: str = "default") -> dict[str, Any]:
    llm = {"profile": profile, "model": model, "base_url": base_url, "capture": True}
    return {"name": name, "task": {"llm": llm, "limits": {"max_steps": 4}}}


async def exported(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    response = await client.get(url, headers=ALICE)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def check_against_server(line: dict[str, Any], sent: list[dict[str, Any]]) -> None:
    """Messages, mask and every turn's ids and logprobs are what the trainer's server saw
    and sent for this task (its session)."""
    messages, mask, turns = line["messages"], line["mask"], line["turns"]
    assert line["captured"] is True
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert mask == [0, 0, 1, 0, 1]
    assert mask == [int(m["role"] == "assistant") for m in messages]
    assert messages[1]["content"].endswith("\nSteps Remaining: 4")
    assert messages[3]["content"].endswith("\nSteps Remaining: 3")
    names = {t["function"]["name"] for t in line["tools"]}
    assert names == {"execute_bash", "str_replace_editor", "submit"}
    assert len(turns) == len(sent) == 2
    for turn, answer in zip(turns, sent, strict=True):
        request = messages[: turn["request_messages"]]
        assert turn["prompt_token_ids"] == answer["prompt_token_ids"] == prompt_ids(request)
        assert turn["completion_token_ids"] == answer["token_ids"]
        assert turn["completion_token_ids"]
        assert turn["logprobs"] == answer["logprobs"]
        assert messages[turn["message_index"]]["role"] == "assistant"
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "tool_calls"]
    assert turns[0]["tool_call"]["tool"] == "execute_bash"


async def test_four_captured_attempts_export_what_the_trainers_server_sent(
    rl: Settings,
    api: httpx.AsyncClient,
    trainer: ScriptedLLMServer,
    scripted_llm: ScriptedLLMServer,
) -> None:
    mixed = answering(trainer, "4", "5", "4", "4")  # rollouts 0..3 of the group: 1, 0, 1, 1
    right = answering(trainer, "4")
    body = {
        "name": "grpo",
        "dataset": {"rows": [{"id": "q1", "problem_statement": "2+2?", "ground_truth": "4"}]},
        "arms": [
            arm("mixed", mixed, trainer.base_url),  # streamed
            arm("right", right, trainer.base_url, profile="plain"),  # not streamed
        ],
        "scorer": {"kind": "math"},
        "attempts": 4,
        "concurrency": 4,
    }
    async with running_worker(rl):
        created = await api.post("/v1/experiments", json=body, headers=ALICE)
        assert created.status_code == 202, created.text
        url = f"/v1/experiments/{created.json()['id']}"
        api.headers.update(ALICE)
        await settled(api, url, "finished")

    lines = await exported(api, f"{url}/export?format=jsonl")
    assert len(lines) == 8
    assert trainer.failures == []
    assert scripted_llm.requests.get(mixed) is None  # the profile's server was never called
    assert scripted_llm.requests.get(right) is None
    streamed, plain = trainer.last_request(mixed), trainer.last_request(right)
    assert streamed is not None
    assert streamed["stream"] is True
    assert plain is not None
    assert "stream" not in plain
    by_session: dict[str, list[dict[str, Any]]] = {}
    for model in (mixed, right):
        for answer in trainer.sent(model):
            by_session.setdefault(answer["session"], []).append(answer)
    assert set(by_session) == {line["task_id"] for line in lines}  # the session header

    # As sent, to the byte: the tools' and messages' JSON text with its keys in the order
    # sent (a chat template renders that text into the prompt; `jsonb` reordered it).
    as_sent = [line for line in lines if line["arm"] == "right"]
    for line in as_sent:
        assert json.dumps(line["tools"]) == json.dumps(plain["tools"])
    sent_messages = json.dumps(plain["messages"])
    count = len(plain["messages"])
    assert any(json.dumps(line["messages"][:count]) == sent_messages for line in as_sent)

    std = math.sqrt(0.75 * 0.25)  # population std of 1, 0, 1, 1
    for line in lines:
        check_against_server(line, by_session[line["task_id"]])
        wrote = json.loads(line["messages"][2]["tool_calls"][0]["function"]["arguments"])
        reward = 1.0 if "boxed{4}" in wrote["command"] else 0.0
        assert line["reward"] == reward
        assert (line["status"], line["finish_reason"]) == ("succeeded", "submitted")
        assert line["infrastructure_failure"] is False
        assert line["group_id"] == f"{line['arm']}:q1"
        if line["arm"] == "mixed":
            assert line["group_mean"] == pytest.approx(0.75)
            assert line["group_std"] == pytest.approx(std)
            assert line["advantage"] == pytest.approx((reward - 0.75) / (std + EPS))
            assert line["advantage_centered"] == pytest.approx(reward - 0.75)
        else:
            assert (line["reward"], line["advantage"], line["group_std"]) == (1.0, 0.0, 0.0)
    mixed_rewards = sorted(line["reward"] for line in lines if line["arm"] == "mixed")
    assert mixed_rewards == [0.0, 1.0, 1.0, 1.0]

    groups = (await api.get(f"{url}/results")).json()["groups"]
    assert [(g["group_id"], g["n"]) for g in groups] == [("mixed:q1", 4), ("right:q1", 4)]
    assert [g["excluded"] for g in groups] == [{}, {}]
    assert groups[0]["mean"] == pytest.approx(0.75)
    assert groups[0]["std"] == pytest.approx(std)
    advantages = {r["task_id"]: r["advantage"] for g in groups for r in g["rollouts"]}
    assert advantages == {line["task_id"]: line["advantage"] for line in lines}
    assert [r["attempt"] for r in groups[0]["rollouts"]] == [1, 2, 3, 4]

    one = lines[0]
    (alone,) = await exported(api, f"/v1/tasks/{one['task_id']}/export?format=jsonl")
    assert alone == one
    for path in (f"{url}/export", f"/v1/tasks/{one['task_id']}/export"):
        assert_error(await api.get(path, headers=BOB), 404, "not_found")
        assert_error(await api.get(f"{path}?format=parquet", headers=ALICE), 422, "invalid_input")


async def finished(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        task: dict[str, Any] = (await client.get(f"/v1/tasks/{task_id}", headers=ALICE)).json()
        if task["status"] not in ("queued", "running"):
            return task
        await asyncio.sleep(0.2)
    raise AssertionError(f"{task_id} did not finish")


async def test_a_lone_task_without_capture_exports_its_turns_and_its_failure_kind(
    rl: Settings, api: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    done = f"rl-{uuid.uuid4().hex[:8]}"
    # A thought with characters JSON leaves raw but `splitlines` (the reader below, and
    # `iter_lines`) ends a line at: the export must still be one line per rollout.
    thought = "I give up\u2028here\u2029and\x85there"
    turn = Turn("execute_bash", {"command": "true"}, content=thought)
    scripted_llm.add_script(done, Script([turn] * 2))
    broken = f"rl-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(broken, Script([Turn("submit", {})], fail_status=500))
    ids = []
    async with running_worker(rl):
        for model in (done, broken):
            body = {"prompt": "p", "llm": {"model": model}, "limits": {"max_steps": 2}}
            created = await api.post("/v1/tasks", json=body, headers=ALICE)
            assert created.status_code == 202, created.text
            ids.append(created.json()["id"])
        ended = [await finished(api, task_id) for task_id in ids]
    assert [t["finish_reason"] for t in ended] == ["max_steps", "llm_error"]
    (plain,) = await exported(api, f"/v1/tasks/{ids[0]}/export")
    assert plain["captured"] is False
    assert (plain["messages"], plain["mask"], plain["tools"]) == (None, None, None)
    assert (plain["reward"], plain["group_id"], plain["experiment_id"]) == (None, None, None)
    assert plain["infrastructure_failure"] is False  # out of steps: the model's doing
    assert [t["tool_call"]["tool"] for t in plain["turns"]] == ["execute_bash"] * 2
    assert [t["thought"] for t in plain["turns"]] == [thought] * 2
    assert {t["completion_token_ids"] for t in plain["turns"]} == {None}
    (failed,) = await exported(api, f"/v1/tasks/{ids[1]}/export")
    assert failed["infrastructure_failure"] is True  # the model server failed
    assert failed["finish_reason"] == "llm_error"


async def test_a_base_url_no_longer_allowed_when_the_worker_runs_it_is_not_called(
    rl: Settings, api: httpx.AsyncClient, trainer: ScriptedLLMServer
) -> None:
    model = answering(trainer, "4")
    body = {"prompt": "p", "llm": {"model": model, "base_url": trainer.base_url}}
    created = await api.post("/v1/tasks", json=body, headers=ALICE)
    assert created.status_code == 202, created.text
    async with running_worker(rl.model_copy(update={"llm_allowed_base_urls": []})):
        ended = await finished(api, created.json()["id"])
    assert ended["finish_reason"] == "llm_error"
    assert "SANDHIVE_LLM_ALLOWED_BASE_URLS" in ended["error"]
    assert trainer.requests.get(model) is None
