"""Three episodes at once through the golden calls: every observation byte-identical to the
paper's package, and every conversation identical to what the service's own loop sends.

The loop's side is recorded by running `Runner.play` (the code path a task takes) in
this process with a model that makes the same calls and keeps a copy of every request's
messages; the trainer's side is the conversation built only from the API's answers.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from app.agent.types import Completion, DeltaCallback, Message, ToolSchema
from app.clients.episode_env import AsyncEnv, EpisodeError, StepResult
from app.config import Settings
from app.domain.resolve import resolve_spec
from app.llm.openai import parse_completion
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost
from app.schemas.tasks import TaskCreate
from app.worker.episodes.live import _Sink
from tests.agent.test_golden import expected_observation, load_golden
from tests.episodes.conftest import ALICE, tool_turn
from tests.support.zygote import AppProcess

SPEC: dict[str, Any] = {"tools": {"profile": "reference"}, "limits": {"max_steps": 100}}


def golden_turns() -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    prompt, steps = load_golden()
    turns = [tool_turn(f"call_{s['index']}", s["tool"], s["arguments"]) for s in steps]
    return prompt["problem_statement"], steps, turns


class Recording:
    """A model that makes the given turns and keeps each request's messages."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.turns = iter(turns)
        self.sent: list[list[Message]] = []
        self.tools: list[ToolSchema] = []

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        self.sent.append(copy.deepcopy(list(messages)))
        self.tools = list(tools)
        return parse_completion({"choices": [{"message": next(self.turns)}]})


async def service_loop(settings: Settings, problem: str, turns: list[dict[str, Any]]) -> Recording:
    spec = resolve_spec(TaskCreate(prompt=problem, **SPEC), settings)
    model = Recording(turns)
    async with DockerHost() as docker:
        runner = Runner(settings, docker)
        labels = {"sandhive.test": uuid.uuid4().hex}
        result = await runner.play(runner.episode(spec, problem, labels=labels), model, _Sink())
    assert result.outcome.finish_reason.value == "submitted", result.outcome.error
    return model


async def drive(
    api: httpx.AsyncClient, problem: str, turns: list[dict[str, Any]]
) -> tuple[AsyncEnv, list[list[Message]], list[StepResult]]:
    """One episode through every turn with the client: the conversation before each call."""
    env = AsyncEnv(api, {"prompt": problem, **SPEC})
    await env.reset()
    before_calls = [copy.deepcopy(env.messages)]
    answers = []
    for turn in turns:
        answer = await env.step(turn)
        answers.append(answer)
        if not answer.done:
            before_calls.append(copy.deepcopy(env.messages))
    return env, before_calls, answers


async def test_three_parallel_episodes_match_the_golden_file_and_the_loop(
    episode_settings: Settings, worker: AppProcess, api: httpx.AsyncClient
) -> None:
    problem, steps, turns = golden_turns()
    api.headers.update(ALICE)
    loop_run = asyncio.create_task(service_loop(episode_settings, problem, turns))
    runs = await asyncio.gather(*(drive(api, problem, turns) for _ in range(3)))
    recorded = await loop_run
    assert len({env.id for env, _, _ in runs}) == 3
    for env, before_calls, answers in runs:
        assert env.tools == recorded.tools
        assert [m["role"] for m in before_calls[0]] == ["system", "user"]
        assert before_calls[0][1]["content"].endswith("\nSteps Remaining: 100")
        # What the trainer would send before every call is what the loop sent, byte for byte.
        assert json.dumps(before_calls) == json.dumps(recorded.sent)
        for golden, answer in zip(steps, answers, strict=True):
            if golden["observation_sent_to_model"] is None:  # the submit ends it
                assert answer.done
                assert answer.finish_reason == "submitted"
                continue
            assert not answer.done
            (tool_message,) = answer.messages
            assert tool_message["role"] == "tool"
            assert tool_message["content"] == expected_observation("reference", golden, steps)
            timings = answer.info["timings"]
            assert timings["api_ms"] >= timings["worker_ms"] >= 0
        with pytest.raises(EpisodeError) as refused:
            await env.step(turns[-1])
        assert refused.value.status == 409
        state = (await api.get(f"/v1/episodes/{env.id}")).json()
        assert (state["status"], state["finish_reason"]) == ("done", "submitted")
        assert state["steps"] == len(turns)
        await env.close()
        closed = (await api.get(f"/v1/episodes/{state['id']}")).json()
        assert closed["status"] == "closed"
