"""Helpers for the LLM driver tests: tool schemas, unique model names, a raw HTTP server."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app.llm.scripted import Script, ScriptedLLMServer

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


@asynccontextmanager
async def raw_http_server(status: int, body: bytes, content_type: str) -> AsyncIterator[str]:
    """A real loopback HTTP server answering every request with fixed bytes; yields base_url."""

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
        await reader.readexactly(length)
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        await server.wait_closed()
