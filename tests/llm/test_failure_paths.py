"""Failure paths of both clients against real loopback HTTP servers.

Anthropic streams that fail mid-way (an `error` event, a stream cut before
`message_stop`), a read timeout retried without blocking the event loop, and an
OpenAI-compatible model that refuses `temperature`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from app.errors import LLMError
from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import REFUSES_TEMPERATURE, OpenAIChatModel
from app.scripted import Script, ScriptedLLMServer, Turn
from app.scripted.anthropic import render_message
from app.scripted.stream import sse, stream_events
from tests.llm.support import TOOLS, USER, Reply, planned_server, register

# ---------------------------------------------------------------- Anthropic streams

ANSWER = Turn(tool="submit", content="Done, submitting.")


async def events_of(body: dict[str, Any]) -> list[bytes]:
    """The full event stream of a Messages API answer (the scripted server's renderer)."""
    message = render_message(str(body["model"]), 0, ANSWER, 10)
    return [event async for event in stream_events(message)]


def stream_reply(events: Callable[[list[bytes]], list[bytes]]) -> Reply:
    async def reply(body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 200, "text/event-stream", b"".join(events(await events_of(body)))

    return reply


def overloaded_midway(events: list[bytes]) -> list[bytes]:
    """message_start, then Anthropic's `event: error` (as the API sends when overloaded)."""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return [events[0], sse("error", error)]


def invalid_midway(events: list[bytes]) -> list[bytes]:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    return [events[0], sse("error", error)]


def cut_before_stop(events: list[bytes]) -> list[bytes]:
    """Everything but the final message_stop: the connection closed early."""
    assert b"message_stop" in events[-1]
    return events[:-1]


def whole(events: list[bytes]) -> list[bytes]:
    return events


def anthropic(url: str, **options: Any) -> AnthropicChatModel:
    settings: dict[str, Any] = {
        "base_url": url,
        "api_key": "sk-ant-test",
        "model": "claude-test",
        "temperature": 0.7,
        "max_tokens": 4096,
        "max_retries": 2,
        "backoff_s": 0.01,
    }
    settings.update(options)
    return AnthropicChatModel(**settings)


async def collect(kind: str, fragment: str) -> None:
    """A delta callback: it turns streaming on."""


@pytest.mark.parametrize(
    "failing",
    [overloaded_midway, cut_before_stop],
    ids=["overloaded-error-event", "cut-before-message-stop"],
)
async def test_a_stream_failing_midway_is_retried_then_the_answer_is_used(
    failing: Callable[[list[bytes]], list[bytes]],
) -> None:
    async with planned_server([stream_reply(failing), stream_reply(whole)]) as (url, seen):
        model = anthropic(url)
        try:
            completion = await model.complete(USER, TOOLS, collect)
        finally:
            await model.aclose()
    assert len(seen.bodies) == 2
    assert all(body["stream"] is True for body in seen.bodies)
    assert completion.content == "Done, submitting."
    assert [call.name for call in completion.tool_calls] == ["submit"]


async def test_an_overloaded_stream_every_time_ends_in_a_clear_error() -> None:
    async with planned_server([stream_reply(overloaded_midway)]) as (url, seen):
        model = anthropic(url, max_retries=1)
        try:
            with pytest.raises(LLMError, match=r"stream failed: overloaded_error: Overloaded"):
                await model.complete(USER, TOOLS, collect)
        finally:
            await model.aclose()
    assert len(seen.bodies) == 2  # the first attempt and one retry


async def test_a_request_error_event_is_not_retried() -> None:
    async with planned_server([stream_reply(invalid_midway), stream_reply(whole)]) as (url, seen):
        model = anthropic(url)
        try:
            with pytest.raises(LLMError, match=r"invalid_request_error: bad.*after 1 attempt"):
                await model.complete(USER, TOOLS, collect)
        finally:
            await model.aclose()
    assert len(seen.bodies) == 1


async def test_a_stream_always_cut_short_names_the_missing_message_stop() -> None:
    async with planned_server([stream_reply(cut_before_stop)]) as (url, seen):
        model = anthropic(url, max_retries=2)
        try:
            with pytest.raises(LLMError) as caught:
                await model.complete(USER, TOOLS, collect)
        finally:
            await model.aclose()
    assert len(seen.bodies) == 3
    message = str(caught.value)
    assert "stream failed: incomplete: the stream ended before message_stop" in message
    assert "after 3 attempt(s)" in message


# ---------------------------------------------------------------- read timeouts


async def test_a_read_timeout_is_retried_without_blocking_the_event_loop(
    llm_server: ScriptedLLMServer,
) -> None:
    name = register(llm_server, Script([Turn(tool="submit", delay_s=6.0)], repeat_last=True))
    model = OpenAIChatModel(
        base_url=llm_server.base_url,
        api_key="",
        model=name,
        temperature=None,
        max_tokens=256,
        timeout_s=1.0,
        max_retries=1,
        backoff_s=0.05,
    )
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        with pytest.raises(LLMError) as caught:
            await model.complete(USER, TOOLS)
    finally:
        ticker.cancel()
        await model.aclose()
    elapsed = time.monotonic() - started
    assert llm_server.requests[name] >= 2  # the timed-out request was sent again
    assert "timed out: ReadTimeout" in str(caught.value)
    assert "after 2 attempt(s)" in str(caught.value)
    assert elapsed < 5.0  # two 1 s timeouts, not the 6 s answers
    # The loop kept running: the ticker ran all along. A blocking wait would stall it for
    # a whole 1 s timeout; the bound leaves room for a loaded 2-core host.
    during = [t for t in ticks if t <= started + elapsed]
    assert len(during) >= 20
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) < 0.9


# ---------------------------------------------------------------- temperature refusals

PLAIN = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "plain answer"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
}
REFUSAL = {
    "error": {
        "message": "Unsupported value: 'temperature' does not support 0.5 with this model. "
        "Only the default (1) value is supported.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }
}


def picky(status: int) -> Reply:
    """Refuses any request carrying `temperature` with `status`; answers the others."""

    async def reply(body: dict[str, Any]) -> tuple[int, str, bytes]:
        if "temperature" in body:
            return status, "application/json", json.dumps(REFUSAL).encode()
        return 200, "application/json", json.dumps(PLAIN).encode()

    return reply


def openai(url: str, model: str, **options: Any) -> OpenAIChatModel:
    settings: dict[str, Any] = {
        "base_url": url,
        "api_key": "",
        "model": model,
        "temperature": 0.5,
        "max_tokens": 256,
        "max_retries": 0,  # the resend without temperature is not a retry
        "backoff_s": 0.01,
    }
    settings.update(options)
    return OpenAIChatModel(**settings)


@pytest.mark.parametrize("status", [400, 422])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_model_that_refuses_temperature_is_asked_without_it(
    status: int, streamed: bool
) -> None:
    delta = collect if streamed else None
    async with planned_server([picky(status)]) as (url, seen):
        first = openai(url, f"reasoner-{status}-{streamed}")
        again = openai(url, f"reasoner-{status}-{streamed}")
        other = openai(url, f"other-{status}-{streamed}")
        try:
            answered = await first.complete(USER, TOOLS, delta)
            assert [("temperature" in b) for b in seen.bodies] == [True, False]
            await first.complete(USER, TOOLS, delta)  # remembered: asked without it at once
            await again.complete(USER, TOOLS, delta)  # a new client for the same model too
            assert [("temperature" in b) for b in seen.bodies] == [True, False, False, False]
            await other.complete(USER, TOOLS, delta)  # another model still gets it first
            assert [("temperature" in b) for b in seen.bodies[4:]] == [True, False]
        finally:
            for model in (first, again, other):
                await model.aclose()
            REFUSES_TEMPERATURE.clear()
    assert answered.content == "plain answer"
    assert seen.bodies[0]["temperature"] == 0.5
    assert seen.bodies[1]["max_tokens"] == 256  # otherwise the same request
    assert seen.bodies[1]["messages"] == seen.bodies[0]["messages"]


@pytest.mark.parametrize(
    "error",
    [
        {"message": "max_tokens is too large"},
        {"message": "temperature must be less than or equal to 2", "param": None},
        {  # OpenAI's own shape for a value out of range: it names the parameter too
            "message": "Invalid 'temperature': decimal above maximum value. Expected a value"
            " <= 1, but got 1.5 instead.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "decimal_above_max_value",
        },
        {  # a validation error echoing the request (vLLM / pydantic style)
            "message": "Extra inputs are not permitted",
            "input": {"temperature": 0.5, "frobnicate": True},
        },
    ],
)
async def test_other_refusals_keep_temperature_and_fail(error: dict[str, Any]) -> None:
    refusal = json.dumps({"error": error}).encode()

    async def reply(body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 400, "application/json", refusal

    async with planned_server([reply]) as (url, seen):
        model = openai(url, "strict-model")
        try:
            with pytest.raises(LLMError, match="HTTP 400"):
                await model.complete(USER, TOOLS)
        finally:
            await model.aclose()
    assert len(seen.bodies) == 1
    assert seen.bodies[0]["temperature"] == 0.5
    assert not REFUSES_TEMPERATURE
