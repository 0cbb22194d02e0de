"""What follows `[DONE]` never fails, slows or repeats a streamed answer that is already whole.

The client reads past `[DONE]` to the response's end so that its connection is kept
(tests/llm/test_shared_client.py); these servers misbehave after `[DONE]`: they keep
the stream open, send far more than the client reads, or break the stream. Each answers
over a real loopback socket; the answer must come back once, whole, and at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.llm import sse
from app.llm.openai import OpenAIChatModel
from app.scripted.stream import completion_chunks
from tests.llm.support import TOOLS, USER

ANSWER = {
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}
EVENTS = (
    b"".join(
        b"data: " + json.dumps(chunk).encode() + b"\n\n"
        for chunk in completion_chunks(ANSWER, include_usage=True)
    )
    + b"data: [DONE]\n\n"
)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
Tail = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def held_open(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(60)


async def long_tail(writer: asyncio.StreamWriter) -> None:
    """Four times what the client reads past [DONE], in comment lines, then held open."""
    line = b": " + b"x" * 1022 + b"\n"
    writer.write(line * (4 * sse.AFTER_DONE_MAX_CHARS // len(line)))
    await writer.drain()
    await asyncio.sleep(60)


async def broken(writer: asyncio.StreamWriter) -> None:
    """Closes the connection before the length it announced: an incomplete body."""
    writer.close()


TAILS: dict[str, Tail] = {"held open": held_open, "long tail": long_tail, "broken": broken}


@pytest.fixture(params=sorted(TAILS))
async def misbehaving(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[int]]]:
    """A server whose every streamed answer is whole, then `request.param` after [DONE]."""
    tail = TAILS[request.param]
    requests: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        requests.append(1)
        # The broken server announces more than it sends; the others send no length at all
        # and end the body only by closing (which they do not).
        length = b"Content-Length: %d\r\n" % (len(EVENTS) + 100) if tail is broken else b""
        writer.write(HEAD + length + b"\r\n" + EVENTS)
        await writer.drain()
        try:
            await tail(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1", requests


async def test_the_answer_is_returned_once_and_at_once_whatever_follows_done(
    misbehaving: tuple[str, list[int]],
) -> None:
    url, requests = misbehaving
    model = OpenAIChatModel(
        base_url=url, api_key="", model="m", temperature=None, max_tokens=8, max_retries=2
    )
    deltas: list[str] = []

    async def on_delta(kind: str, fragment: str) -> None:
        deltas.append(fragment)

    try:
        async with asyncio.timeout(10 * sse.AFTER_DONE_TIMEOUT_S):  # not the 1200 s read timeout
            completion = await model.complete(USER, TOOLS, on_delta)
    finally:
        await model.aclose()
    assert completion.content == "42"
    assert completion.completion_tokens == 1
    assert "".join(deltas) == "42", "the text was streamed once"
    assert len(requests) == 1, "a whole answer is never asked again"
