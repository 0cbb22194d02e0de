"""`app.clients.skyrl_env.SandhiveTextEnv` made by SkyRL-gym's own registry (`skyrl-gym`,
pinned in the `rl` extra) as its trainer makes environments, against a live service: the
first messages describe the tools in the text, each `step` takes the model's raw text (a
Hermes `<tool_call>`, plain text, a broken call) and answers observations, reward 0 until
`done`, then the scorer's reward; a trajectory stopped at `max_turns` scores 0."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import skyrl_gym
from omegaconf import OmegaConf
from skyrl_gym.envs.base_text_env import BaseTextEnv

from app.agent.tools import NO_TOOL_CALL_NUDGE
from app.clients.skyrl_env import SandhiveTextEnv, parse_tool_call
from tests.episodes.test_env_clients import live  # noqa: F401 (fixture)
from tests.episodes.test_rllm_env import service  # noqa: F401 (fixture: SANDHIVE_URL and key)

ENV_ID = "sandhive-test"
EXTRAS = {
    "reward_spec": {"method": "rule", "ground_truth": "42"},
    "extra_info": {"domain": "math"},
}
PROMPT = [{"role": "user", "content": "What is 6 times 7?"}]
ANSWER = "/testbed/output/answer.txt"


def call(name: str, arguments: dict[str, Any], before: str = "") -> str:
    """A completion as a Hermes-templated model writes a call."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"{before}<tool_call>\n{body}\n</tool_call>"


def make(env_config: Any = None, **extras: Any) -> SandhiveTextEnv:
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point="app.clients.skyrl_env:SandhiveTextEnv")
    env = skyrl_gym.make(ENV_ID, env_config=env_config or {}, extras={**EXTRAS, **extras})
    assert isinstance(env, BaseTextEnv)
    assert isinstance(env, SandhiveTextEnv)
    return env


def trajectory() -> list[Any]:
    env = make()
    try:
        messages, info = env.init(PROMPT)
        write = f"printf '\\\\boxed{{42}}' > {ANSWER}; echo written"
        steps = [
            env.step(call("execute_bash", {"command": write}, before="I will write it.\n")),
            env.step("I think the answer is 42."),  # no call: the package's nudge
            env.step("<tool_call>\n{not json\n</tool_call>"),  # broken: repaired, explained
            env.step(call("submit", {})),
        ]
        return [messages, info, steps, env.get_metrics()]
    finally:
        env.close()


async def test_skyrls_registry_makes_the_env_and_a_text_trajectory_earns_its_reward(
    service: None,  # noqa: F811
) -> None:
    messages, info, steps, metrics = await asyncio.to_thread(trajectory)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "<tools>" in messages[0]["content"]
    assert '"name": "execute_bash"' in messages[0]["content"]
    assert "What is 6 times 7?" in messages[1]["content"]
    assert info["episode_id"].startswith("epi_")

    wrote, nudged, broken, submitted = steps
    assert (wrote["reward"], wrote["done"]) == (0.0, False)
    assert wrote["observations"][0]["role"] == "user"
    assert "[STDOUT]\nwritten" in wrote["observations"][0]["content"]
    assert nudged["observations"][0]["content"].startswith(NO_TOOL_CALL_NUDGE.split("\n")[0])
    assert (broken["reward"], broken["done"]) == (0.0, False)
    assert broken["observations"], "a broken call gets an observation, not an error"
    assert (submitted["reward"], submitted["done"], submitted["observations"]) == (1.0, True, [])
    assert submitted["metadata"]["finish_reason"] == "submitted"
    assert metrics == {"steps": 4, "submitted": 1.0}


async def test_a_trajectory_stopped_at_max_turns_scores_zero(
    service: None,  # noqa: F811
) -> None:
    def stopped() -> Any:
        # SkyRL's own config is OmegaConf's: nested, and merged over the defaults.
        config = OmegaConf.create({"episode": {"limits": {"timeout_s": 300}}})
        env = make(config, max_turns=1)
        assert env.episode_spec["limits"] == {"max_steps": 1, "timeout_s": 300}
        try:
            env.init(PROMPT)
            write = f"printf '\\\\boxed{{42}}' > {ANSWER}"
            return env.step(call("execute_bash", {"command": write}))
        finally:
            env.close()

    last = await asyncio.to_thread(stopped)
    assert (last["done"], last["reward"], last["observations"]) == (True, 0.0, [])


def test_tool_calls_are_parsed_as_hermes_templates_write_them() -> None:
    assert parse_tool_call("plain") == ("plain", None)
    text, function = parse_tool_call(call("execute_bash", {"command": "ls"}, before="Look.\n"))
    assert text == "Look."
    assert function == {"name": "execute_bash", "arguments": '{"command": "ls"}'}
    assert parse_tool_call('<tool_call>{"name": "submit"}</tool_call>')[1] == {
        "name": "submit",
        "arguments": "{}",
    }
    assert parse_tool_call("<tool_call>[1]</tool_call>")[1] == {"name": "", "arguments": "[1]"}
