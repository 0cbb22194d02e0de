"""OpenEnv's session messages mapped onto an episode's: its actions (MCP-style
`call_tool`/`list_tools`, or the model's whole assistant message) to the assistant
message a step takes, and a step's answer to OpenEnv's observation, reward and done.

OpenEnv (`openenv-core`) serialises an observation as `{"observation": {...}, "reward",
"done"}`; its `MCPToolClient` reads `tools` as a tool listing and `tool_name`/`result`/
`error` as a tool's answer, and its `GenericEnvClient` takes the dicts as they are, so
the shapes here are those, with Sandhive's own fields (`messages`, `metadata`) beside.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from app.schemas.episodes import EpisodeCreate, EpisodeOpened, EpisodeStepOut, RewardOut
from app.schemas.tasks import JsonObject

NAME = "sandhive-llm-in-sandbox"
DESCRIPTION = (
    "The paper's LLM-in-Sandbox environment on Sandhive episodes: a Linux sandbox and the "
    "tools execute_bash, str_replace_editor and submit; reset opens an episode (its data is "
    "a POST /v1/episodes body), step runs one tool call, the reward comes at done."
)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CallTool(_Message):
    """One tool call, as OpenEnv's `CallToolAction` (`MCPToolClient.call_tool`) sends it."""

    type: Literal["call_tool"] = "call_tool"
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


class ListTools(_Message):
    """The episode's tools, as OpenEnv's `ListToolsAction` asks for them."""

    type: Literal["list_tools"] = "list_tools"
    metadata: JsonObject = Field(default_factory=dict)


class SendMessage(_Message):
    """The model's own assistant message (content, reasoning, tool calls), for a trainer
    that keeps the model's text as it was sampled: the step is `POST .../step`'s."""

    type: Literal["message"] = "message"
    message: JsonObject
    metadata: JsonObject = Field(default_factory=dict)


Action = Annotated[CallTool | ListTools | SendMessage, Field(discriminator="type")]
ACTION: TypeAdapter[CallTool | ListTools | SendMessage] = TypeAdapter(Action)


class ResetData(EpisodeCreate):
    """A `reset`'s data: an episode's body, and OpenEnv's own reset keys, which Sandhive
    takes and does not use (a sandbox has no seed; episode ids are the service's)."""

    seed: int | None = None
    episode_id: str | None = Field(default=None, max_length=255)

    def episode(self) -> EpisodeCreate:
        return EpisodeCreate.model_validate(self.model_dump(exclude={"seed", "episode_id"}))


class ToolError(BaseModel):
    """OpenEnv's `ToolError`: the service failed the call, not the tool."""

    error_type: Literal["transport_error", "invalid_args", "tool_not_found", "timeout"]
    message: str


class Observation(BaseModel):
    """What `observation` holds after a reset or a step (the keys that apply)."""

    messages: list[JsonObject] = Field(default_factory=list)
    """Reset: the system and first user message; step: what to append after the
    assistant message (the tool's result with its Steps Remaining suffix)."""
    tools: list[JsonObject] | None = None
    """Reset and `list_tools`: `{name, description, input_schema}` per tool."""
    openai_tools: list[JsonObject] | None = None
    """Reset: the same tools in the OpenAI `tools` shape, exactly as a model is offered them."""
    tool_name: str | None = None
    """Step: the tool that ran (the first call of the message)."""
    result: str | None = None
    """Step: the tool's observation text, Steps Remaining suffix included."""
    error: ToolError | None = None
    """Step: set when the service, not the tool, failed (reward null, never 0)."""
    metadata: JsonObject = Field(default_factory=dict)
    """`episode_id`, `step_count`, `finish_reason`, `error_kind`, `timings`, and at done
    `reward_detail` (the scorer's) or `reward_error` (why there is no reward)."""


class State(BaseModel):
    """`state`: OpenEnv's `episode_id` and `step_count`, and the episode's status."""

    episode_id: str | None
    step_count: int
    status: str | None = None
    finish_reason: str | None = None


def schemas() -> dict[str, Any]:
    """`GET /schema`: OpenEnv's action, observation and state schemas (and reset's data)."""
    return {
        "action": ACTION.json_schema(),
        "observation": Observation.model_json_schema(),
        "state": State.model_json_schema(),
        "reset": ResetData.model_json_schema(),
    }


def mcp_tools(openai_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The OpenAI `tools` list as MCP tool specs (`name`, `description`, `input_schema`)."""
    out = []
    for tool in openai_tools:
        function = tool.get("function") or {}
        out.append(
            {
                "name": function.get("name", ""),
                "description": function.get("description", ""),
                "input_schema": function.get("parameters") or {"type": "object"},
            }
        )
    return out


def assistant_message(action: CallTool | SendMessage, step_count: int) -> dict[str, Any]:
    """The assistant message the episode's step takes for this action."""
    if isinstance(action, SendMessage):
        return dict(action.message)
    function = {"name": action.tool_name, "arguments": json.dumps(action.arguments)}
    call = {"id": f"call_{step_count + 1}", "type": "function", "function": function}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def tool_name(message: dict[str, Any]) -> str | None:
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        name = (calls[0].get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    return None


def opened(episode: EpisodeOpened) -> dict[str, Any]:
    """Reset's observation; its first messages are in `metadata` too, where OpenEnv's
    `MCPToolClient` (which reads a reset with `tools` as a tool listing) keeps them."""
    observation = Observation(
        messages=episode.messages,
        tools=mcp_tools(episode.tools),
        openai_tools=episode.tools,
        metadata={"episode_id": episode.id, "step_count": 0, "messages": episode.messages},
    )
    return {"observation": _dump(observation), "reward": None, "done": False}


def listed(openai_tools: list[dict[str, Any]], episode_id: str, step_count: int) -> dict[str, Any]:
    observation = Observation(
        tools=mcp_tools(openai_tools),
        openai_tools=openai_tools,
        metadata={"episode_id": episode_id, "step_count": step_count},
    )
    return {"observation": _dump(observation), "reward": None, "done": False}


def stepped(
    out: EpisodeStepOut,
    message: dict[str, Any],
    episode_id: str,
    step_count: int,
    reward: RewardOut | str | None,
) -> dict[str, Any]:
    """A step's answer: reward 0 before done (the paper's), the scorer's at done, and
    null with the reason when the service failed or nothing could score it."""
    metadata: dict[str, Any] = {
        "episode_id": episode_id,
        "step_count": step_count,
        "finish_reason": out.finish_reason,
        "error_kind": out.error_kind,
        "timings": out.timings,
    }
    error = None
    if out.error_kind == "infrastructure":
        error = ToolError(error_type="transport_error", message=out.error or "the service failed")
    value: float | None = None if out.done else 0.0
    if isinstance(reward, RewardOut):
        value = reward.score
        metadata["reward_detail"] = {"scorer": reward.scorer, "reason": reward.reason}
    elif isinstance(reward, str):
        metadata["reward_error"] = reward
    observation = Observation(
        messages=out.messages,
        tool_name=tool_name(message),
        result="\n".join(str(m.get("content", "")) for m in out.messages),
        error=error,
        metadata=metadata,
    )
    return {"observation": _dump(observation), "reward": value, "done": out.done}


def _dump(observation: Observation) -> dict[str, Any]:
    return observation.model_dump(mode="json", exclude_none=True)
