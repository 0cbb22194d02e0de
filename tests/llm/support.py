"""Helpers for the LLM driver tests: tool schemas, unique model names, loopback HTTP servers."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from app.scripted import Script, ScriptedLLMServer

TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": {"type": "object"}},
    }
    for name in ("execute_bash", "str_replace_editor", "submit")
]

USER = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Compute 6*7."},
]


def register(server: ScriptedLLMServer, script: Script, prefix: str = "model") -> str:
    """Add a script under a fresh model name and return that name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    server.add_script(name, script)
    return name


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Reply = Callable[[dict[str, Any]], Awaitable[tuple[int, str, bytes]]]
"""Request body -> (status, content type, response body)."""


class Recorded:
    """The request bodies a loopback server received, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []


@asynccontextmanager
async def planned_server(replies: Sequence[Reply]) -> AsyncIterator[tuple[str, Recorded]]:
    """A real HTTP server answering request N with replies[N] (the last one repeats)."""
    seen = Recorded()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        raw = await reader.readexactly(length)
        body = json.loads(raw) if raw else {}
        seen.bodies.append(body)
        reply = replies[min(len(seen.bodies), len(replies)) - 1]
        status, content_type, data = await reply(body)
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def raw_http_server(status: int, body: bytes, content_type: str) -> AsyncIterator[str]:
    """A real loopback HTTP server answering every request with fixed bytes; yields base_url."""

    async def reply(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return status, content_type, body

    async with planned_server([reply]) as (url, _seen):
        yield url
