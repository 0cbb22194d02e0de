"""Context-length recovery: max_tokens shrinks as the reference package does, retries untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from app.errors import ContextOverflow, LLMError
from app.llm.openai import OpenAIChatModel
from app.llm.recovery import is_context_error, is_overflow, next_max_tokens, parse_limits
from app.scripted import Script, ScriptedLLMServer, Turn, prompt_tokens_of
from tests.llm.support import TOOLS, USER, register

SGLANG = (
    "Requested token count exceeds the model's maximum context length of 32768 tokens. You "
    "requested a total of 70000 tokens: 4464 tokens from the input messages and 65536 tokens "
    "for the completion."
)
OPENAI = (
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
    "(1000 in the messages, 8000 in the completion)."
)
VLLM = (
    "'max_tokens' is too large: 65536. This model's maximum context length is 40960 tokens "
    "and your request has 1234 input tokens (65536 > 40960 - 1234)."
)
ANTHROPIC = (
    "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
    "decrease input length or `max_tokens` and try again"
)


@asynccontextmanager
async def scripted_model(
    server: ScriptedLLMServer, name: str, *, max_tokens: int, max_retries: int
) -> AsyncIterator[OpenAIChatModel]:
    """A client of one scripted model (no key, no temperature, quick retries), closed after."""
    model = OpenAIChatModel(
        base_url=server.base_url,
        api_key="",
        model=name,
        temperature=None,
        max_tokens=max_tokens,
        max_retries=max_retries,
        backoff_s=0.01,
    )
    try:
        yield model
    finally:
        await model.aclose()


LLAMA_CPP = (
    '{"error":{"code":400,"message":"request (9521 tokens) exceeds the available context size '
    '(8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9521,'
    '"n_ctx":8192}}'
)
"""llama-server's answer to a prompt over its context, as measured (tests/real_llm)."""


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        (SGLANG, (32768, 4464)),
        (OPENAI, (8192, 1000)),
        (VLLM, (40960, 1234)),
        (ANTHROPIC, (200000, 188240)),
        (LLAMA_CPP, (8192, 9521)),
        ("prompt is too long: 210000 tokens > 200000 maximum", None),
    ],
)
def test_limits_are_parsed_in_every_dialect(text: str, limits: tuple[int, int] | None) -> None:
    assert parse_limits(text) == limits
    assert is_context_error(400, text)


def test_the_reference_rule_for_the_next_max_tokens() -> None:
    assert next_max_tokens(65536, SGLANG) == 32768 - 4464 - 100
    assert next_max_tokens(65536, VLLM) == 40960 - 1234 - 100
    assert next_max_tokens(65536, OPENAI) is None  # 8192 - 1000 - 100 is below the 8192 floor
    assert next_max_tokens(20000, SGLANG) is None  # not smaller than what failed
    # llama.cpp's own words: no room left at all, so fail now rather than halve and resend
    assert next_max_tokens(65536, LLAMA_CPP) is None
    vague = "Input tokens exceed the configured limit."
    assert next_max_tokens(65536, vague) == 32768
    assert next_max_tokens(10000, vague) == 8192
    assert next_max_tokens(8192, vague) is None  # the floor: give up rather than loop
    assert next_max_tokens(None, vague) is None


def test_a_rate_limit_that_mentions_tokens_is_not_a_context_error() -> None:
    text = "Rate limit reached: tokens per min (TPM): Limit 30000, Used 29000"
    assert not is_context_error(429, text)
    assert is_context_error(400, text)
    assert not is_context_error(400, "Invalid value for temperature")


@pytest.mark.parametrize("dialect", ["sglang", "openai"])
async def test_the_server_named_limit_sets_max_tokens_without_using_a_retry(
    llm_server: ScriptedLLMServer, dialect: str
) -> None:
    window = 40000
    script = Script(
        turns=[Turn(tool="submit"), Turn(tool="submit")],
        context_window=window,
        context_error=dialect,  # type: ignore[arg-type]
    )
    name = register(llm_server, script)
    async with scripted_model(llm_server, name, max_tokens=65536, max_retries=0) as model:
        completion = await model.complete(USER, TOOLS)
        body = llm_server.last_request(name)
        assert body is not None
        assert body["max_tokens"] == window - prompt_tokens_of(body) - 100
        assert completion.tool_calls[0].name == "submit"
        assert llm_server.requests[name] == 2

        history = [*USER, completion.message]
        history.append({"role": "tool", "tool_call_id": "call_0", "content": "ok"})
        await model.complete(history, TOOLS)  # the lowered value is kept: one request
        assert llm_server.requests[name] == 3


async def test_an_unparsable_error_halves_max_tokens_down_to_the_floor(
    llm_server: ScriptedLLMServer,
) -> None:
    name = register(
        llm_server, Script([Turn(tool="submit")], context_window=20000, context_error="vague")
    )
    async with scripted_model(llm_server, name, max_tokens=65536, max_retries=0) as model:
        await model.complete(USER, TOOLS)
    body = llm_server.last_request(name)
    assert body is not None
    assert body["max_tokens"] == 16384  # 65536 -> 32768 -> 16384
    assert llm_server.requests[name] == 3


async def test_a_window_too_small_for_the_floor_fails_at_once(
    llm_server: ScriptedLLMServer,
) -> None:
    name = register(llm_server, Script([Turn(tool="submit")], context_window=8000))
    async with scripted_model(llm_server, name, max_tokens=16384, max_retries=3) as model:
        with pytest.raises(LLMError, match="maximum context length of 8000") as info:
            await model.complete(USER, TOOLS)
    # The prompt fits; the floor of max_tokens does not: a setting to fix, not the model's
    # budget used up.
    assert not isinstance(info.value, ContextOverflow)
    details = info.value.details
    assert isinstance(details, dict)
    assert details["status"] == 400
    assert details["attempts"] == 1  # a 400 is not retried
    assert llm_server.requests[name] == 1


@pytest.mark.parametrize(
    ("status", "text", "overflow"),
    [
        (400, "request (9521 tokens) exceeds the available context size (8192 tokens)", True),
        (400, "prompt is too long: 210000 tokens > 200000 maximum", True),
        (
            400,
            "This model's maximum context length is 4096 tokens. However, you requested "
            "5000 tokens (4500 in the messages, 500 in the completion).",
            True,
        ),
        # The prompt fits: max_tokens is over what the model allows (a setting, not the model)
        (
            400,
            "'max_tokens' is too large: 8192. This model's maximum context length is 4096 "
            "tokens and your request has 20 input tokens",
            False,
        ),
        (
            400,
            "max_tokens: 8192 > 4096, which is the maximum allowed number of output tokens",
            False,
        ),
        (413, "Request too large on tokens per minute (TPM): Limit 6000, Requested 9000", False),
        (429, "prompt is too long for your rate limit of tokens", False),
        (500, "request (9521 tokens) exceeds the available context size (8192 tokens)", False),
    ],
)
def test_only_a_conversation_longer_than_the_window_is_an_overflow(
    status: int, text: str, overflow: bool
) -> None:
    assert is_overflow(status, text) is overflow
