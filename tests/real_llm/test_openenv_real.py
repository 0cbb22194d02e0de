"""OpenEnv's own `GenericEnvClient` drives a Sandhive episode with the real model's answers:
each turn, llama.cpp (SmolLM2) is asked with the session's messages and tools, and its whole
assistant message is the action. The model chooses badly, so the test asserts what the
service does with any answer: an observation to append each turn, the step count, the
episode's end (its step limit) with a reward of 0 from its scorer, never an error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from app.config import Settings
from tests.real_llm.conftest import ALIAS, RealServer
from tests.support.processes import Service, api_key, keyed_service

MAX_STEPS = 3


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with keyed_service(settings, tmp_path) as svc:
        yield svc


async def test_openenvs_client_drives_an_episode_with_the_real_models_messages(
    service: Service, settings: Settings, real_llm: RealServer, tmp_path: Path
) -> None:
    key = api_key(settings.model_copy(update={"auth": "keys"}), "trainer", tmp_path)
    url = service.base_url.replace("http://", f"http://t:{key}@") + "/v1/openenv"
    env = GenericEnvClient(base_url=url, message_timeout_s=300)
    await env.connect()
    try:
        opened = await env.reset(
            prompt="List the files in /testbed.",
            prompt_config={
                "system": "You are a helpful assistant.",
                "instance": "{problem_statement}",
            },
            limits={"max_steps": MAX_STEPS},
            scorer={"kind": "math"},
            ground_truth="42",
        )
        messages: list[dict[str, Any]] = list(opened.observation["messages"])
        tools = opened.observation["openai_tools"]
        result = opened
        async with httpx.AsyncClient(timeout=600) as model:
            for turn in range(1, MAX_STEPS + 1):
                body = {"model": ALIAS, "messages": messages, "tools": tools, "max_tokens": 128}
                body |= {"temperature": 0, "seed": 7}
                answer = await model.post(f"{real_llm.base_url}/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                message = answer.json()["choices"][0]["message"]
                result = await env.step({"type": "message", "message": message})
                appended = result.observation["messages"]
                assert appended
                assert all(m["role"] in ("tool", "user") for m in appended)
                messages += [message, *appended]
                assert (await env.state())["step_count"] == turn
                if result.done:
                    break
        assert result.done, "the episode ends at its step limit whatever the model did"
        metadata = result.observation["metadata"]
        assert metadata["finish_reason"] in ("max_steps", "submitted"), metadata
        assert result.reward == 0.0, metadata  # scored (the model never answers 42), not null
        assert "error" not in result.observation
    finally:
        await env.close()
