"""The whole service against a real llama.cpp server: API -> worker -> sandbox -> model.

The model (SmolLM2-135M) is tiny and chooses badly, so these tests assert the shapes of
what the service does with its answers (a stored step with the model's text, its parsed
call, the server's token counts and our timings; live deltas equal to the stored text; a
terminal status), never what it chose. Temperature 0 keeps it repeatable.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from app import metrics
from app.agent.tools import NO_TOOL_CALL_NUDGE, tool_schemas
from app.api.app import create_app
from app.bus import keys
from app.config import Settings
from app.llm.openai import OpenAIChatModel
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.real_llm.conftest import ALIAS, RealServer

TERMINAL = {"succeeded", "failed", "cancelled"}
TOOLS = {"execute_bash", "str_replace_editor", "submit"}
LIST_FILES = "List the files in /testbed."
SHORT_SYSTEM = "You are a helpful assistant."
"""A short system prompt keeps each call under 1,000 prompt tokens (about a second here)."""
TASK_TIMEOUT_S = 600
WORKER_WAIT_S = 900
"""Generous: a turn takes about a second on two idle cores, but a minute and more when other
test runs load them (a cold 950-token prompt at a few tokens per second)."""
EXTRA_BODY = {"seed": 7}
"""With temperature 0, the same answer on every run (llama.cpp's own sampler seed)."""


def profiles_file(tmp_path: Path, servers: dict[str, tuple[RealServer, bool]]) -> Path:
    """A TOML of named profiles: name -> (server, stream)."""
    lines = []
    for name, (server, stream) in servers.items():
        lines += [
            f"[profiles.{name}]",
            f'base_url = "{server.base_url}"',
            f'model = "{ALIAS}"',
            f"stream = {'true' if stream else 'false'}",
            "",
        ]
    path = tmp_path / "profiles.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def real_settings(
    make_settings: Callable[..., Settings], docker_image: str, real_llm: RealServer, tmp_path: Path
) -> Settings:
    return make_settings(
        sandbox_image=docker_image,
        llm_base_url=real_llm.base_url,
        llm_model=ALIAS,
        llm_profiles_file=profiles_file(tmp_path, {"plain": (real_llm, False)}),
        llm_retry_backoff_s=0.05,
        llm_max_retries=1,
        worker_concurrency=2,
    )


@pytest.fixture
async def api(real_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(real_settings)) as client:
        yield client


def task_body(prompt: str, *, profile: str = "default", **llm: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "llm": {
            "profile": profile,
            "temperature": 0,
            "max_tokens_per_call": 60,
            "extra_body": EXTRA_BODY,
            **llm,
        },
        "limits": {"max_steps": 2, "timeout_s": TASK_TIMEOUT_S},
        "prompt_config": {"system": SHORT_SYSTEM},
    }


async def submit(api: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await api.post("/v1/tasks", json=body)
    assert response.status_code in (200, 201, 202), response.text
    return str(response.json()["id"])


async def finished(api: httpx.AsyncClient, task_id: str) -> tuple[dict[str, Any], list[Any]]:
    task = (await api.get(f"/v1/tasks/{task_id}")).json()
    steps = (await api.get(f"/v1/tasks/{task_id}/trajectory")).json()["steps"]
    return task, steps


async def live_events(redis: Redis, task_id: str) -> list[dict[str, Any]]:
    """Every event the worker published live for the task (kept a while after its end)."""
    entries = await redis.xrange(keys.live_events(task_id))
    return [json.loads(fields[b"e"]) for _, fields in entries]


def assert_real_step(step: dict[str, Any]) -> None:
    """A step as the real model and server made it: counts reported, time measured."""
    assert step["prompt_tokens"] > 0, json.dumps(step)
    assert step["completion_tokens"] > 0, step
    assert step["llm_ms"] > 0, step
    assert isinstance(step["thought"], str)
    if step["action"] is not None:
        assert step["action"]["tool"] in TOOLS, step["action"]
        assert isinstance(step["action"]["arguments"], dict)
        assert step["tool_ms"] >= 0


async def test_a_real_tool_call_runs_end_to_end_streamed_and_not(
    api: httpx.AsyncClient, real_settings: Settings, redis: Redis, real_llm: RealServer
) -> None:
    """Through API, worker and sandbox: the model's first turn is a real `execute_bash` call
    (the template's example turn makes SmolLM2 start with `<tool_call>`), parsed from the
    server's answer, run in the sandbox and answered; every turn stored with the real text,
    the server's own token counts and our timings; (streamed) the live deltas and the
    command's live start and output; a terminal status whatever the model does next."""
    streamed = await submit(api, task_body(LIST_FILES))
    plain = await submit(api, task_body(LIST_FILES, profile="plain"))
    dropped_before = live_events_dropped()
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)
    dropped = live_events_dropped() - dropped_before
    reported = await server_usage(real_llm, LIST_FILES)
    for task_id, stream in ((streamed, True), (plain, False)):
        task, steps = await finished(api, task_id)
        assert task["status"] in TERMINAL, task
        assert steps, task
        for step in steps:
            assert_real_step(step)
        first = steps[0]
        assert first["action"] is not None, f"no tool call (stream={stream}): {first}"
        assert first["action"]["tool"] == "execute_bash", first["action"]
        assert isinstance(first["action"]["arguments"].get("command"), str), first["action"]
        assert first["observation"].startswith("Exit code: "), first["observation"]
        assert "Execution output of \\[execute_bash]:" in first["observation"]
        assert first["exit_code"] is not None, "the command ran in the sandbox"
        assert (first["prompt_tokens"], first["completion_tokens"]) == reported, (
            "the step's counts are the server's own for the same request"
        )
        events = await live_events(redis, task_id)
        deltas = [e for e in events if e["type"] == "llm.delta"]
        if stream:
            for step in steps:
                text = "".join(
                    e["data"].get("text", "") for e in deltas if e["data"]["index"] == step["index"]
                )
                # Live events are best-effort: a worker that falls behind (loaded CPU, slow
                # Postgres) drops and counts them; what does arrive is the stored text's start.
                assert step["thought"].startswith(text), ("live deltas out of order", events)
                if not dropped:
                    assert text == step["thought"], ("the live deltas are the stored text", events)
            started = [e["data"] for e in events if e["type"] == "tool.started"]
            assert {"index": 0, **first["action"]} in started, started
        else:
            assert deltas == [], "a profile with stream = false asks for one JSON answer"
        usage = task["usage"]
        assert usage["prompt_tokens"] == sum(s["prompt_tokens"] for s in steps)
        assert usage["completion_tokens"] == sum(s["completion_tokens"] for s in steps)


def live_events_dropped() -> float:
    """Live events the in-process worker dropped so far (`sandhive_live_events_dropped`)."""
    return sum(
        metrics.LIVE_EVENTS_DROPPED.labels(reason)._value.get()
        for reason in ("backlog", "publish_failed")
    )


async def server_usage(server: RealServer, prompt: str) -> tuple[int, int]:
    """(prompt, completion) tokens the server reports for the loop's first request, sent by
    hand: the same messages, tools, temperature, seed and cap as `task_body`."""
    body = {
        "model": ALIAS,
        "messages": [
            {"role": "system", "content": SHORT_SYSTEM},
            {"role": "user", "content": f"{prompt}\nSteps Remaining: 2"},
        ],
        "tools": tool_schemas("standard"),
        "temperature": 0,
        "max_tokens": 60,
        **EXTRA_BODY,
    }
    async with httpx.AsyncClient(timeout=TASK_TIMEOUT_S) as client:
        answer = (await client.post(f"{server.base_url}/chat/completions", json=body)).json()
    assert answer["choices"][0]["finish_reason"] == "tool_calls", answer
    usage = answer["usage"]
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def test_a_prompt_over_the_context_window_ends_context_limit_naming_it(
    api: httpx.AsyncClient, real_settings: Settings
) -> None:
    """The server's window used up is the model's budget, as our own is: `context_limit`
    (an agent error, a 0 reward), never `llm_error` (which RL masks as infrastructure)."""
    body = task_body("word " * 9000)
    body["limits"]["max_context_tokens"] = 100_000  # our own budget allows it: the server refuses
    task_id = await submit(api, body)
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)
    task, _ = await finished(api, task_id)
    assert (task["status"], task["finish_reason"]) == ("failed", "context_limit"), task
    assert "exceeds the available context size (8192 tokens)" in task["error"], task["error"]
    assert "after 1 attempt(s)" in task["error"], "a refusal that will not heal is not retried"


async def test_our_own_budget_stops_the_same_prompt_before_the_server_sees_it(
    api: httpx.AsyncClient, real_settings: Settings
) -> None:
    body = task_body("word " * 9000)
    body["limits"]["max_context_tokens"] = 8192  # the server's window, set as the task's budget
    task_id = await submit(api, body)
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)
    task, steps = await finished(api, task_id)
    assert task["finish_reason"] == "context_limit", task
    assert "8192" in task["error"]
    assert steps == []


async def test_an_unknown_model_name_is_answered_by_the_one_model_llama_cpp_serves(
    api: httpx.AsyncClient, real_settings: Settings
) -> None:
    """llama-server ignores `model` (it serves one); documented in docs/real-model.md."""
    task_id = await submit(api, task_body(LIST_FILES, model="no-such-model"))
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)
    task, steps = await finished(api, task_id)
    assert task["status"] in TERMINAL, task
    assert task["finish_reason"] != "llm_error", task
    assert steps
    assert all(s["completion_tokens"] > 0 for s in steps)


async def test_a_server_killed_mid_stream_fails_the_task_with_a_clear_llm_error(
    make_settings: Callable[..., Settings],
    docker_image: str,
    doomed_llm: RealServer,
    redis: Redis,
) -> None:
    settings = make_settings(
        sandbox_image=docker_image,
        llm_base_url=doomed_llm.base_url,
        llm_model=ALIAS,
        llm_retry_backoff_s=0.05,
        llm_max_retries=1,
    )
    # In plain text: asked to "write" it, the model now opens a (streamed, unseen) tool call.
    body = task_body(
        "Tell me a very long story about a dragon, in many chapters. Answer in plain text."
    )
    body["llm"]["max_tokens_per_call"] = 2000
    async with serve(create_app(settings)) as api:
        task_id = await submit(api, body)
        running = asyncio.create_task(Worker(settings).run(burst=True))
        for _ in range(2400):  # kill once the answer is streaming
            if any(e["type"] == "llm.delta" for e in await live_events(redis, task_id)):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("no llm.delta within 120 s")
        doomed_llm.kill()
        await asyncio.wait_for(running, WORKER_WAIT_S)
        task, _ = await finished(api, task_id)
    assert (task["status"], task["finish_reason"]) == ("failed", "llm_error"), task
    assert doomed_llm.base_url in task["error"], task["error"]
    assert "closed the connection mid-answer" in task["error"], task["error"]


async def test_a_tool_call_cut_off_by_max_tokens_ends_the_task_cleanly(
    api: httpx.AsyncClient, real_settings: Settings
) -> None:
    """Twelve tokens cut the model off inside `<tool_call>{"name": "execute_`: a malformed call
    in the model's text. Not streamed, llama.cpp returns that text as the content (no
    `tool_calls`); streamed, it holds the text back and sends nothing. Either way the step is
    stored as a turn without a call, the model gets the no-call nudge, the next request is
    accepted (an empty turn goes back as `content: ""`; llama.cpp refuses one without
    content), and the task ends at its step limit."""
    streamed = await submit(api, task_body(LIST_FILES, max_tokens_per_call=12))
    plain = await submit(api, task_body(LIST_FILES, profile="plain", max_tokens_per_call=12))
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)
    for task_id, stream in ((streamed, True), (plain, False)):
        task, steps = await finished(api, task_id)
        assert (task["status"], task["finish_reason"]) == ("failed", "max_steps"), task
        assert len(steps) == 2, steps
        for step in steps:
            assert 0 < step["completion_tokens"] <= 12, json.dumps([task, steps])
            assert step["action"] is None, step
            assert step["observation"] == NO_TOOL_CALL_NUDGE, step
        if stream:
            assert steps[0]["thought"] == "", "llama.cpp streams no part of an unfinished call"
        else:
            assert steps[0]["thought"].startswith("<tool_call>"), steps[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_llama_cpp_gives_each_sampled_tokens_id_and_they_detokenize_to_the_answer(
    real_llm: RealServer, stream: bool
) -> None:
    """With capture on, the completion's token ids come from llama.cpp's logprob entries
    (it ignores `return_token_ids`): one id per logprob, as many as it counted, and its own
    `/detokenize` turns them back into the answer's text."""
    model = OpenAIChatModel(
        base_url=real_llm.base_url,
        api_key="",
        model=ALIAS,
        capture=True,
        stream=stream,
        temperature=0,
        max_tokens=12,
        max_retries=0,
    )
    try:
        completion = await model.complete([{"role": "user", "content": "Say hello."}], [])
    finally:
        await model.aclose()
    capture = completion.capture
    assert capture is not None
    ids, logprobs = capture["token_ids"], capture["logprobs"]
    assert ids, capture
    assert len(ids) == len(logprobs) == completion.completion_tokens
    root = real_llm.base_url.removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        text = (await http.post(f"{root}/detokenize", json={"tokens": ids})).json()["content"]
    assert text == completion.content
