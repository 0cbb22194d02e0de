"""Streamed completions: OpenAIChatModel with `on_delta` against the real scripted server.

A streamed turn must add up to exactly what the same turn answers unstreamed,
while its text and reasoning arrive in fragments; servers that cannot stream
(or ignore the request) still work.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.errors import LLMError
from app.llm.openai import OpenAIChatModel
from app.llm.sse import ChunkAssembler, sse_lines
from app.scripted import Script, ScriptedLLMServer, Turn
from app.scripted.stream import completion_chunks
from tests.llm.support import TOOLS, USER, planned_server, register

TURN = Turn(
    tool="str_replace_editor",
    arguments={"command": "create", "path": "/testbed/é.txt", "file_text": "naïve ✓ text\n" * 3},
    content="Writing the file now — with ünïcödé.",
    reasoning="The user wants a file; I will create it.",
)


def model_for(server: ScriptedLLMServer | str, name: str, **options: object) -> OpenAIChatModel:
    base_url = server if isinstance(server, str) else server.base_url
    return OpenAIChatModel(
        base_url=base_url,
        api_key="",
        model=name,
        temperature=0.5,
        max_tokens=256,
        max_retries=0,
        backoff_s=0.01,
        **options,  # type: ignore[arg-type]
    )


class Deltas:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, kind: str, fragment: str) -> None:
        self.seen.append((kind, fragment))

    def joined(self, kind: str) -> str:
        return "".join(text for k, text in self.seen if k == kind)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.seen if k == kind)


async def test_a_streamed_turn_equals_the_plain_one_and_arrives_in_fragments(
    llm_server: ScriptedLLMServer,
) -> None:
    name = register(llm_server, Script(turns=[TURN], repeat_last=True))
    model = model_for(llm_server, name)
    deltas = Deltas()
    try:
        streamed = await model.complete(USER, TOOLS, deltas)
        request = llm_server.last_request(name)
        plain = await model.complete(USER, TOOLS)
    finally:
        await model.aclose()

    assert request is not None
    assert (request["stream"], request["stream_options"]) == (True, {"include_usage": True})
    assert streamed == plain
    assert streamed.tool_calls[0].arguments == TURN.arguments
    assert streamed.prompt_tokens > 0  # the usage chunk was read
    assert deltas.count("text") > 1
    assert deltas.count("reasoning") > 1
    assert deltas.joined("text") == TURN.content
    assert deltas.joined("reasoning") == TURN.reasoning


async def test_parallel_calls_are_reassembled_by_index(llm_server: ScriptedLLMServer) -> None:
    extra = {
        "id": "call_x",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": json.dumps({"command": "ls -la /"})},
    }
    turn = Turn(tool="execute_bash", arguments={"command": "pwd"}, extra_calls=[extra])
    name = register(llm_server, Script(turns=[turn], repeat_last=True))
    model = model_for(llm_server, name)
    try:
        streamed = await model.complete(USER, TOOLS, Deltas())
        plain = await model.complete(USER, TOOLS)
    finally:
        await model.aclose()
    assert [c.arguments for c in streamed.tool_calls] == [
        {"command": "pwd"},
        {"command": "ls -la /"},
    ]
    assert streamed == plain


def test_chunks_without_index_or_with_whole_objects_still_assemble() -> None:
    assembler = ChunkAssembler()
    for delta in (
        {"tool_calls": [{"id": "a", "function": {"name": "submit", "arguments": ""}}]},
        {"tool_calls": [{"function": {"arguments": "{}"}}]},
        {"tool_calls": [{"id": "b", "function": {"name": "execute_bash", "arguments": {"x": 1}}}]},
        {"reasoning": "hm"},
    ):
        assembler.feed({"choices": [{"index": 0, "delta": delta}]})
    message = assembler.completion()["choices"][0]["message"]
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "submit", "arguments": "{}"},
        {"name": "execute_bash", "arguments": '{"x": 1}'},
    ]
    assert message["reasoning"] == "hm"


def test_scripted_chunks_cut_arguments_into_pieces() -> None:
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "n", "arguments": "abcdef"},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 1},
    }
    chunks = completion_chunks(completion, include_usage=True)
    argument_parts = [
        call["function"]["arguments"]
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", [])
    ]
    assert argument_parts == ["", "ab", "cd", "ef"]
    assert chunks[-1] == {**chunks[-1], "choices": [], "usage": {"prompt_tokens": 1}}


@pytest.fixture
async def picky_server() -> AsyncIterator[str]:
    """A real HTTP server that refuses `stream` with a 400 and answers plain requests."""
    plain = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "plain answer"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }

    async def reply(body: dict[str, Any]) -> tuple[int, str, bytes]:
        if body.get("stream"):
            return 400, "application/json", b'{"error": {"message": "stream is not supported"}}'
        return 200, "application/json", json.dumps(plain).encode()

    async with planned_server([reply]) as (url, _seen):
        yield url


async def test_a_server_that_refuses_streaming_is_asked_plainly(picky_server: str) -> None:
    model = model_for(picky_server, "any")
    deltas = Deltas()
    try:
        first = await model.complete(USER, TOOLS, deltas)
        second = await model.complete(USER, TOOLS, deltas)
    finally:
        await model.aclose()
    assert first.content == second.content == "plain answer"
    assert deltas.seen == []


async def test_streaming_can_be_turned_off(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[TURN]))
    model = model_for(llm_server, name, stream=False)
    deltas = Deltas()
    try:
        completion = await model.complete(USER, TOOLS, deltas)
    finally:
        await model.aclose()
    body = llm_server.last_request(name)
    assert body is not None
    assert "stream" not in body
    assert completion.content == TURN.content
    assert deltas.seen == []


@pytest.fixture
async def broken_stream_server() -> AsyncIterator[str]:
    """Answers every request with an event stream whose event is not JSON."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        data = b"data: {not json\n\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1"


async def test_a_malformed_stream_is_a_clear_llm_error(broken_stream_server: str) -> None:
    model = model_for(broken_stream_server, "any")
    try:
        with pytest.raises(LLMError, match="malformed stream"):
            await model.complete(USER, TOOLS, Deltas())
    finally:
        await model.aclose()


SEPARATORS = "give up\u2028here\u2029and\u0085there\x0cfeed\x1c"
"""Characters `str.splitlines` ends a line at, which JSON leaves raw inside a string."""


@pytest.fixture
async def raw_separator_server() -> AsyncIterator[str]:
    """Streams a text turn as vLLM-style servers do: the model's text unescaped (JSON
    allows U+2028 and friends raw), CRLF line ends, each cut between two writes."""

    handled: list[asyncio.Future[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handled.append(asyncio.get_running_loop().create_future())
        await reader.readuntil(b"\r\n\r\n")
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": SEPARATORS}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        events = [f"data: {json.dumps(c, ensure_ascii=False)}\r\n\r\n" for c in chunks]
        body = ("".join(events) + "data: [DONE]\r\n\r\n").encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        for piece in body.split(b"\r\n"):  # every CR and its LF in separate writes
            writer.write(piece + b"\r")
            await writer.drain()
            await asyncio.sleep(0.005)
            writer.write(b"\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        handled[-1].set_result(None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1"
        await asyncio.wait_for(asyncio.gather(*handled), 5)


async def test_line_separators_in_the_models_text_stay_in_the_text(
    raw_separator_server: str,
) -> None:
    model = model_for(raw_separator_server, "any")
    deltas = Deltas()
    try:
        completion = await model.complete(USER, TOOLS, deltas)
    finally:
        await model.aclose()
    assert completion.content == SEPARATORS
    assert deltas.joined("text") == SEPARATORS


async def test_sse_lines_end_only_at_cr_lf_or_crlf() -> None:
    async def chunks() -> AsyncIterator[str]:
        for chunk in ["a\u2028b\r", "\nc\rd", "\n\ne\x85f\r\n", "", "\r", "g"]:
            yield chunk

    assert [line async for line in sse_lines(chunks())] == [
        "a\u2028b",
        "c",
        "d",
        "",
        "e\x85f",
        "",
        "g",
    ]
