"""The clients of app/clients/episode_env.py against a live service (`sandhive serve` and `sandhive
worker` processes): the sync `Env` and the package-shaped `PackageEnv` replay the golden
calls byte-identically, and `Env`, `AsyncEnv` and `PackageEnv` reset, reward and close.

The loop's side of the comparison is `Runner.play` in this process (the code path a task
takes), recorded as in test_golden_episodes.py; that file drives `AsyncEnv` in process.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.clients.episode_env import AsyncEnv, Env, EpisodeError, PackageEnv
from app.config import Settings
from tests.agent.test_golden import expected_observation
from tests.e2e.fault_harness import Cluster, cluster
from tests.episodes.conftest import ALICE, tool_turn
from tests.episodes.test_golden_episodes import SPEC, golden_turns, service_loop

ANSWER_FILE = "/testbed/output/answer.txt"
SCORED = {"prompt": "What is 6 x 7?", "scorer": {"kind": "exact"}, "ground_truth": "42"}
WRITE_42 = {
    "name": "str_replace_editor",
    "arguments": {"command": "create", "path": ANSWER_FILE, "file_text": "42"},
}
SUBMIT = {"name": "submit", "arguments": {}}


def as_message(call: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return tool_turn(call_id, call["name"], call["arguments"])


@pytest.fixture
def live(episode_settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    """The API and one worker as processes, the worker ready (its heartbeat written)."""
    with cluster(episode_settings, tmp_path) as procs:
        procs.start_api()
        procs.start_worker("env-worker")
        deadline = time.monotonic() + 60
        log = tmp_path / "env-worker.log"
        while not log.exists() or "ready with" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the worker never got ready:\n{procs.logs()}"
            time.sleep(0.05)
        yield procs


@pytest.fixture
def client(live: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base_url, headers=ALICE, timeout=120) as sync_client:
        yield sync_client


def replay_with_env(client: httpx.Client, problem: str, turns: list[dict[str, Any]]) -> Any:
    """The golden calls through `Env`: the conversation before each call, and each answer."""
    env = Env(client, {"prompt": problem, **SPEC})
    first = env.reset()
    assert first == env.messages
    before_calls = [copy.deepcopy(env.messages)]
    answers = []
    for turn in turns:
        answers.append(env.step(turn))
        if not answers[-1].done:
            before_calls.append(copy.deepcopy(env.messages))
    return env, before_calls, answers


async def test_sync_env_replays_the_golden_calls_byte_identically(
    episode_settings: Settings, client: httpx.Client
) -> None:
    problem, steps, turns = golden_turns()
    recorded = await service_loop(episode_settings, problem, turns)
    env, before_calls, answers = await asyncio.to_thread(replay_with_env, client, problem, turns)
    assert env.tools == recorded.tools
    assert json.dumps(before_calls) == json.dumps(recorded.sent)
    for golden, answer in zip(steps, answers, strict=True):
        if golden["observation_sent_to_model"] is None:
            assert (answer.done, answer.finish_reason, answer.infrastructure) == (
                True,
                "submitted",
                False,
            )
            continue
        (tool_message,) = answer.messages
        assert tool_message["content"] == expected_observation("reference", golden, steps)
    with pytest.raises(EpisodeError) as after:
        await asyncio.to_thread(env.step, turns[-1])
    assert (after.value.status, after.value.code, after.value.infrastructure) == (
        409,
        "conflict",
        False,
    )
    with pytest.raises(EpisodeError) as unscored:  # created without a scorer
        await asyncio.to_thread(env.reward)
    assert unscored.value.status == 409
    episode_id = env.id
    await asyncio.to_thread(env.close)
    assert env.id is None
    closed = await asyncio.to_thread(client.get, f"/v1/episodes/{episode_id}")
    assert closed.json()["status"] == "closed"


def replay_with_package_env(
    client: httpx.Client, problem: str, calls: list[dict[str, Any]]
) -> tuple[PackageEnv, tuple[str, dict[str, Any]], list[tuple[str, float, bool, dict[str, Any]]]]:
    env = PackageEnv(client, {"prompt": problem, **SPEC})
    first = env.reset()
    return env, first, [env.step(call) for call in calls]


async def test_package_env_replays_the_golden_calls_byte_identically(
    episode_settings: Settings, client: httpx.Client
) -> None:
    problem, steps, _ = golden_turns()
    calls = [{"name": s["tool"], "arguments": s["arguments"]} for s in steps]
    # PackageEnv names its calls call_1, call_2, ...: the loop's model makes the same ones.
    turns = [as_message(call, f"call_{n}") for n, call in enumerate(calls, start=1)]
    recorded = await service_loop(episode_settings, problem, turns)
    env, (task, info), results = await asyncio.to_thread(
        replay_with_package_env, client, problem, calls
    )
    assert task == problem
    assert info["messages"] == recorded.sent[0]
    assert info["tools"] == recorded.tools
    for golden, (observation, reward, done, step_info) in zip(steps, results, strict=True):
        assert reward == 0.0  # the reward comes at the end, from compute_final_reward
        if golden["observation_sent_to_model"] is None:
            assert (done, step_info["finish_reason"]) == (True, "submitted")
            continue
        assert not done
        assert observation == expected_observation("reference", golden, steps)
    # The conversation it kept is the loop's, byte for byte, up to the last call.
    assert json.dumps(env.env.messages[: len(recorded.sent[-1])]) == json.dumps(recorded.sent[-1])
    assert PackageEnv.is_multithread_safe()
    await asyncio.to_thread(env.close)


def rewarded_with_env(client: httpx.Client) -> tuple[float, str | None, str | None]:
    env = Env(client, SCORED)
    env.reset()
    abandoned = env.id
    env.reset()  # a reset closes the episode before it
    env.step(as_message(WRITE_42))
    assert env.step(as_message(SUBMIT, "c2")).done
    score = env.reward()
    env.close()
    return score, abandoned, env.id


def rewarded_with_package_env(client: httpx.Client) -> float:
    env = PackageEnv(client, {**SCORED, "tools": {"profile": "reference"}})
    env.reset()
    observation, _, done, _ = env.step(WRITE_42)
    assert not done
    assert "Steps Remaining" in observation
    assert env.step(SUBMIT)[2]
    score = env.compute_final_reward()
    env.close()
    return score


async def rewarded_with_async_env(base_url: str) -> float:
    async with httpx.AsyncClient(base_url=base_url, headers=ALICE, timeout=120) as api:
        env = AsyncEnv(api, SCORED)
        await env.reset()
        await env.step(as_message(WRITE_42))
        assert (await env.step(as_message(SUBMIT, "c2"))).done
        score = await env.reward()
        await env.close()
        return score


async def test_every_client_resets_rewards_and_closes_and_a_lost_worker_is_infrastructure(
    live: Cluster, client: httpx.Client
) -> None:
    (score, abandoned, after_close), package_score, async_score = await asyncio.gather(
        asyncio.to_thread(rewarded_with_env, client),
        asyncio.to_thread(rewarded_with_package_env, client),
        rewarded_with_async_env(live.base_url),
    )
    assert (score, package_score, async_score) == (1.0, 1.0, 1.0)
    assert after_close is None
    reset_away = await asyncio.to_thread(client.get, f"/v1/episodes/{abandoned}")
    assert reset_away.json()["status"] == "closed"

    env = Env(client, {"prompt": "doomed"})
    await asyncio.to_thread(env.reset)
    worker = next(p for p in live.procs if p is not live.api)
    worker.send_signal(signal.SIGKILL)
    await asyncio.to_thread(worker.wait, 10)
    with pytest.raises(EpisodeError) as lost:
        await asyncio.to_thread(env.step, as_message(SUBMIT))
    assert (lost.value.status, lost.value.infrastructure) == (503, True)
