"""`app.clients.rllm_env.LLMinSandboxEnv` against a live service (`sandhive serve` and
`sandhive worker` processes), held to the contract of the paper's RL repository
(shared/REFERENCE.md §3): `from_dict` of a dataset row, `reset -> (task, {"extra_info":
row})`, `step(Action) -> (observation, 0.0, done, {})` with the package's observations
(the recorded golden episode), and `compute_final_reward` scoring `answer.txt` as the
package's router does. The training stack needs GPUs; this is the contract it calls."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.clients.rllm_env import LLMinSandboxEnv, scorer_for_row
from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.agent.test_golden import expected_observation
from tests.e2e.fault_harness import Cluster
from tests.episodes.test_env_clients import client, live  # noqa: F401 (fixtures)
from tests.episodes.test_golden_episodes import golden_turns

ROW = {
    "id": "rl-1",
    "domain": "math_mini",
    "problem_statement": "The hint file says what to multiply. What is the product?",
    "ground_truth": "42",
    "input_files": '{"hint.txt": "six times seven"}',  # a JSON string, as the Hub rows hold
    "qa_type": None,
    "docker_image": "cdx123/llm-in-sandbox:v0.1",
    "step_timeout": 120,
    "verbose": False,
}


class Action:
    """The package's `llm_in_sandbox.action.Action` (0.2.0): what the repository's agent
    hands to `step` (its attributes, which is all the environment reads)."""

    def __init__(self, function_name: str, parameters: dict[str, Any]) -> None:
        self.function_name = function_name
        self.parameters = parameters

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function_name, "parameters": self.parameters}


class RllmAction:
    """rLLM's own `Action` dataclass, which wraps the agent's action as `.action`."""

    def __init__(self, action: Any) -> None:
        self.action = action


def bash(command: str) -> Action:
    return Action("execute_bash", {"command": command})


@pytest.fixture
async def service(
    live: Cluster,  # noqa: F811
    sessions: Sessions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the training script's environment has: the service's URL and a tenant's key."""
    made = await keys.create_key(sessions, "trainer", "rl")
    monkeypatch.setenv("SANDHIVE_URL", live.base_url)
    monkeypatch.setenv("SANDHIVE_API_KEY", made.key)


def play(answer: str) -> tuple[Any, ...]:
    env = LLMinSandboxEnv.from_dict(dict(ROW))
    task, info = env.reset()
    hint = env.step(bash("cat /testbed/documents/hint.txt"))
    write = env.step(RllmAction(bash(f"printf '\\\\boxed{{{answer}}}' > /testbed/answer.txt")))
    submitted = env.step(Action("submit", {}).to_dict())
    reward = env.compute_final_reward()
    env.close()
    return task, info, hint, write, submitted, reward


async def test_a_row_runs_as_the_papers_environment_and_scores_its_answer_file(
    service: None,
) -> None:
    task, info, hint, write, submitted, reward = await asyncio.to_thread(play, "42")
    assert task == ROW["problem_statement"]
    expected_row = {
        k: v for k, v in ROW.items() if k not in ("docker_image", "step_timeout", "verbose")
    }
    assert info == {"extra_info": expected_row}
    observation, step_reward, done, extra = hint
    package = "Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\nsix times seven"
    assert observation == package
    assert (step_reward, done, extra) == (0.0, False, {})
    assert "Steps Remaining" not in observation  # the repository's agent adds it
    assert write[1:] == (0.0, False, {})
    assert submitted[1:] == (0.0, True, {})
    assert reward == 1.0  # \boxed{42} by the package's math rule
    *_, wrong = await asyncio.to_thread(play, "41")
    assert wrong == 0.0


async def test_the_golden_episode_gives_the_packages_observations(
    episode_settings: Settings,
    client: httpx.Client,  # noqa: F811
) -> None:
    problem, steps, _ = golden_turns()
    row = {"problem_statement": problem, "domain": "math", "ground_truth": "3"}

    def replay() -> list[tuple[str, float, bool, dict[str, Any]]]:
        env = LLMinSandboxEnv(
            row, client=client, input_dir="/testbed/input", output_dir="/testbed/output"
        )
        env.reset()
        answers = [env.step(Action(s["tool"], s["arguments"])) for s in steps]
        env.close()
        return answers

    answers = await asyncio.to_thread(replay)
    for golden, (observation, reward, done, info) in zip(steps, answers, strict=True):
        assert (reward, info) == (0.0, {})
        assert done is (golden["tool"] == "submit")
        if golden["observation_sent_to_model"] is None:
            continue
        sent = expected_observation("reference", golden, steps)
        assert observation == sent.rsplit("\nSteps Remaining: ", 1)[0]


async def test_a_stopped_episode_scores_zero_and_a_bad_action_is_refused(
    service: None,
    client: httpx.Client,  # noqa: F811
) -> None:
    def stopped() -> float:
        env = LLMinSandboxEnv.from_dict(dict(ROW))
        env.reset()
        env.step(bash("printf '\\\\boxed{42}' > /testbed/answer.txt"))
        try:
            return env.compute_final_reward()  # the trainer's own budget ended it: closed
        finally:
            env.close()  # as the engine does after every trajectory

    assert await asyncio.to_thread(stopped) == 0.0
    env = LLMinSandboxEnv(dict(ROW), client=client)
    with pytest.raises(TypeError, match="not an action"):
        env.step("execute_bash ls")  # Action.from_string is gone from the package (0.2.0)
    assert LLMinSandboxEnv.is_multithread_safe()


def test_the_reward_follows_the_packages_router() -> None:
    assert scorer_for_row({"domain": "physics_mini"}) == {"kind": "math", "package": True}
    assert scorer_for_row({"domain": "chem"}) == {"kind": "mcq", "package": True}
    assert scorer_for_row({"domain": "biomed_mini"}) == {"kind": "mcq", "package": True}
    assert scorer_for_row({"domain": "instruct_follow"}) == {"kind": "instruction_following"}
    mcq = {"domain": "instruct_pretrain", "qa_type": "Multiple Choice", "ground_truth": "B"}
    assert scorer_for_row(mcq) == {"kind": "mcq", "package": True}
    assert scorer_for_row({**mcq, "ground_truth": "B,C"}) == {"kind": "rouge_l"}
    assert scorer_for_row({"domain": "long_context"}) == {"kind": "rouge_l"}
    own = {"domain": "math", "scorer": {"kind": "exact"}}
    assert scorer_for_row(own) == {"kind": "exact"}
    with pytest.raises(ValueError, match="working_dir"):
        LLMinSandboxEnv.from_dict({**ROW, "working_dir": "/work"})
