"""`/v1/openenv` driven by OpenEnv's own clients (`openenv-core`, pinned in the `rl` extra)
against a live Sandhive (`sandhive serve` + `sandhive worker`, API keys on): `MCPToolClient`
lists and calls the three tools and gets the reward at `submit`; `GenericEnvClient` sends the
model's whole message; a wrong key is refused at the handshake, another tenant never sees the
session's episode, and a dropped connection closes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsObservation,
)
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from app.config import Settings
from tests.episodes.conftest import containers, sandbox_gone, tool_turn, wait_for
from tests.support.processes import Service, api_key, keyed_service

ANSWER = "/testbed/output/answer.txt"


@pytest.fixture
def keyed(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth": "keys"})


@pytest.fixture
def service(keyed: Settings, tmp_path: Path) -> Iterator[Service]:
    with keyed_service(keyed, tmp_path) as svc:
        yield svc


def env_url(service: Service, key: str) -> str:
    """The URL OpenEnv's clients take, the key as its password (they set no headers)."""
    return service.base_url.replace("http://", f"http://trainer:{key}@") + "/v1/openenv"


def episode(service: Service, key: str, episode_id: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{service.base_url}/v1/episodes/{episode_id}", headers=headers)


def reset_data(**extra: Any) -> dict[str, Any]:
    return {
        "prompt": "What is 6 times 7? Write it to the answer file.",
        "tools": {"profile": "reference"},
        "scorer": {"kind": "math"},
        "ground_truth": "42",
        "seed": 7,  # OpenEnv's reset keys are taken, and change nothing
        **extra,
    }


async def test_openenvs_mcp_client_runs_the_three_tools_and_gets_the_reward_at_submit(
    service: Service, keyed: Settings, tmp_path: Path
) -> None:
    alice, bob = api_key(keyed, "alice", tmp_path), api_key(keyed, "bob", tmp_path)
    async with MCPToolClient(base_url=env_url(service, alice), message_timeout_s=120) as env:
        opened = await env.reset(**reset_data())
        assert isinstance(opened.observation, ListToolsObservation), opened
        tools = {t.name: t for t in opened.observation.tools}
        assert sorted(tools) == ["execute_bash", "str_replace_editor", "submit"]
        assert tools["execute_bash"].input_schema["required"] == ["command"]
        assert (opened.done, opened.reward) == (False, None)
        first = opened.observation.metadata["messages"]  # where MCPToolClient keeps them
        assert [m["role"] for m in first] == ["system", "user"]
        assert {t.name for t in await env.list_tools(use_cache=False)} == set(tools)

        text = await env.call_tool("execute_bash", command="echo 42 > " + ANSWER + "; echo hi")
        # the package's observation, as a model reads it
        expected = "Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\nhi\n"
        assert text == expected + "\nSteps Remaining: 99"
        state = await env.state()
        assert state.episode_id is not None
        assert state.episode_id.startswith("epi_")
        assert state.step_count == 1

        assert await env.call_tool("str_replace_editor", command="view", path=ANSWER)
        submitted = await env.step(CallToolAction(tool_name="submit"))
        assert isinstance(submitted.observation, CallToolObservation)
        assert (submitted.done, submitted.reward) == (True, 1.0), submitted
        assert submitted.observation.error is None

        row = episode(service, alice, state.episode_id).json()
        assert (row["status"], row["steps"], row["finish_reason"]) == ("done", 3, "submitted")
        assert episode(service, bob, state.episode_id).status_code == 404

        with pytest.raises(RuntimeError, match="no more steps"):  # OpenEnv's error reply
            await env.call_tool("execute_bash", command="true")


async def test_the_generic_client_sends_the_models_own_message_and_a_drop_closes_the_episode(
    service: Service, keyed: Settings, tmp_path: Path
) -> None:
    alice = api_key(keyed, "alice", tmp_path)
    env = GenericEnvClient(base_url=env_url(service, alice), message_timeout_s=120)
    await env.connect()
    opened = await env.reset(**reset_data(limits={"max_steps": 5}))
    first = opened.observation
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"].endswith("Steps Remaining: 5")
    assert "execute_bash" in [t["function"]["name"] for t in first["openai_tools"]]
    episode_id = first["metadata"]["episode_id"]

    message = tool_turn("call_a", "execute_bash", {"command": "echo from the model"})
    message["content"] = "Let me look."
    result = await env.step({"type": "message", "message": message})
    assert result.observation["tool_name"] == "execute_bash"
    assert result.observation["messages"][0]["role"] == "tool"
    assert "[STDOUT]\nfrom the model\n" in result.observation["result"]
    assert (result.done, result.reward) == (False, 0.0)  # the paper's: nothing before done

    with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
        await env.step({"type": "call_tool"})  # no tool_name
    with pytest.raises(RuntimeError, match="UNKNOWN_TYPE"):
        await env._send_and_receive({"type": "dance"})

    assert episode(service, alice, episode_id).json()["status"] == "open"
    assert (await env.state())["step_count"] == 1
    label = f"sandhive.episode={episode_id}"
    assert containers(label), "the episode's sandbox runs while the session is open"
    assert env._ws is not None
    await env._ws.close()  # dropped, without OpenEnv's close message

    async def closed() -> bool:
        return bool(episode(service, alice, episode_id).json()["status"] == "closed")

    await wait_for("the dropped session's episode to close", closed, 30)
    await sandbox_gone(label)


async def test_a_wrong_key_is_refused_at_the_handshake_and_the_schemas_are_served(
    service: Service, keyed: Settings, tmp_path: Path
) -> None:
    with pytest.raises(ConnectionError, match="401"):
        await GenericEnvClient(base_url=env_url(service, "sk-not-a-key")).connect()
    with pytest.raises(ConnectionError, match="401"):  # no key at all
        await GenericEnvClient(base_url=service.base_url + "/v1/openenv").connect()

    headers = {"Authorization": f"Bearer {api_key(keyed, 'alice', tmp_path)}"}
    base = service.base_url + "/v1/openenv"
    async with httpx.AsyncClient(base_url=base, headers=headers) as http:
        assert (await http.get("/health")).json() == {"status": "healthy"}
        assert (await http.get("/metadata")).json()["name"] == "sandhive-llm-in-sandbox"
        schema = (await http.get("/schema")).json()
    assert {"action", "observation", "state", "reset"} <= set(schema)
    kinds = {branch["properties"]["type"]["const"] for branch in schema["action"]["$defs"].values()}
    assert kinds == {"call_tool", "list_tools", "message"}
    assert "prompt" in schema["reset"]["required"]
