"""SkyRL-gym's text environment on Sandhive episodes: `SandhiveTextEnv`, a `BaseTextEnv`
(`skyrl-gym`, the `rl` extra) whose `step` takes the model's raw text.

SkyRL builds an environment per trajectory as `env_class(env_config, extras)` (`extras` is
the dataset row less its prompt), calls `init(prompt)` for the first messages, then
`step(text)` with each sampled completion until `done`, then `close()`. Here:

- `init` opens an episode (`POST /v1/episodes`) whose problem is the prompt's last user
  message (or the row's `extra_info.problem_statement`), and answers the episode's own
  system and user messages, the tools described in the system message as Hermes-style
  chat templates (Qwen's) describe them, so a model that sees only text knows them;
- `step` parses the first `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` of
  the text, as SkyRL's examples parse their tags, and runs it as the episode's step; text
  without a call is sent as it is (the episode answers the package's nudge), and a call
  that is not JSON goes as the model wrote it (the episode repairs the history and says
  why). The observation comes back as `observation_role` messages (`user`, as SkyRL's
  examples, or `tool`);
- the reward is 0 until `done`, then the episode's scorer on its answer: the row's
  `reward_spec` (`ground_truth`, and `scorer`, else the paper's router by `domain`, as
  `app.clients.rllm_env.scorer_for_row`). `max_turns` (the row's, or `extra_info`'s) stops
  a trajectory early: it scores 0, as the paper's overlong penalty does. An
  infrastructure failure raises `EpisodeError` (`infrastructure` set): never a 0.

Register it with SkyRL as `skyrl_gym.register(id="sandhive",
entry_point="app.clients.skyrl_env:SandhiveTextEnv")`. The service is `env_config`'s
`sandhive_url`/`api_key`, else `SANDHIVE_URL`/`SANDHIVE_API_KEY`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from app.clients.episode_env import Env, EpisodeError, client_from_environment, http_client
from app.clients.rllm_env import scorer_for_row
from app.domain.hermes_calls import split_tool_calls

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_AFTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
"""The tool description Qwen's chat template writes into the system message."""


def parse_tool_call(text: str) -> tuple[str, dict[str, str] | None]:
    """(the text before the first tool call, that call as an OpenAI `function` or None)."""
    content, calls = split_tool_calls(text)
    return content, (calls[0] if calls else None)


def with_tools(system: str, tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(tool) for tool in tools)
    return system + TOOLS_PREAMBLE + listed + TOOLS_AFTER


class SandhiveTextEnv(BaseTextEnv):  # type: ignore[misc]
    """One trajectory, one Sandhive episode (the `reference` tools profile by default)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = _plain(env_config)
        self.extras = _plain(extras)
        info = dict(self.extras.get("extra_info") or {})
        self.info = info
        self.reward_spec = dict(self.extras.get("reward_spec") or {})
        self.max_turns = int(self.extras.get("max_turns") or info.get("max_turns") or 100)
        self.observation_role = str(config.get("observation_role", "user"))
        if self.observation_role not in ("user", "tool"):
            raise ValueError(f"observation_role is user or tool, not {self.observation_role!r}")
        episode = dict(config.get("episode") or {})
        limits = {"max_steps": self.max_turns, **dict(episode.pop("limits", None) or {})}
        self.episode_spec: dict[str, Any] = {
            "tools": {"profile": "reference"},
            **episode,
            "limits": limits,
        }
        self.client = _client(config)
        self.env = Env(self.client, self.episode_spec)
        self.finish_reason: str | None = None

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        problem = self.info.get("problem_statement") or _last_user(prompt)
        row = {**self.info, "ground_truth": self.reward_spec.get("ground_truth")}
        if "scorer" in self.reward_spec:
            row["scorer"] = self.reward_spec["scorer"]
        self.env.spec = {
            "prompt": str(problem),
            "scorer": scorer_for_row(row),
            "ground_truth": row["ground_truth"],
            **self.episode_spec,
        }
        messages = [dict(m) for m in self.env.reset()]
        messages[0]["content"] = with_tools(str(messages[0]["content"]), self.env.tools)
        return messages, {"episode_id": self.env.id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        content, function = parse_tool_call(action)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if function is not None:
            call_id = f"call_{self.turns}"
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
        result = self.env.step(message)
        if result.infrastructure:  # the service failed, not the policy: never a 0
            details = {"error_kind": "infrastructure", "finish_reason": result.finish_reason}
            raise EpisodeError(
                503, {"error": {"message": result.info.get("error"), "details": details}}
            )
        self.finish_reason = result.finish_reason
        done = result.done or self.turns >= self.max_turns
        reward = self._final_reward() if done else 0.0
        observations = [] if done else self._observations(result.messages)
        metadata = {"episode_id": self.env.id, "finish_reason": result.finish_reason}
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=reward,
            done=done,
            metadata=metadata,
            postprocessed_action=None,
        )

    def close(self) -> None:
        self.env.close()
        self.client.close()

    def get_metrics(self) -> dict[str, Any]:
        return {"steps": self.turns, "submitted": float(self.finish_reason == "submitted")}

    def _observations(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        role = self.observation_role
        return [{"role": role, "content": str(m.get("content", ""))} for m in messages]

    def _final_reward(self) -> float:
        """The scorer's reward on an ended episode; 0 for one stopped at `max_turns`."""
        try:
            return self.env.reward()
        except EpisodeError as exc:
            if exc.infrastructure or exc.status != 409 or "not ended" not in str(exc):
                raise
        self.env.close()
        return 0.0


def _plain(value: Any) -> dict[str, Any]:
    """A dict of plain values from what SkyRL passes: an OmegaConf `DictConfig` (its
    environment config, nested) or a dict."""
    if value is None:
        return {}
    try:
        from omegaconf import OmegaConf  # skyrl-gym's own dependency
    except ImportError:
        return dict(value)
    if OmegaConf.is_config(value):
        plain: Any = OmegaConf.to_container(value, resolve=True)
        return {str(key): item for key, item in plain.items()} if isinstance(plain, dict) else {}
    return dict(value)


def _last_user(prompt: list[dict[str, Any]]) -> str:
    for message in reversed(prompt):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    raise ValueError("the prompt has no user message and the row no problem_statement")


def _client(config: Mapping[str, Any]) -> httpx.Client:
    url = config.get("sandhive_url")
    if not url:
        return client_from_environment()
    key = config.get("api_key")
    return http_client(str(url), str(key) if key else None)
