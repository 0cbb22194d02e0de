"""A real HTTP receiver on loopback for webhook tests: it records every request and answers
with the status codes a test scripts (then 200)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = 0
    statuses: list[int] = field(default_factory=list)
    """Answered in order, one per request; 200 once used up."""
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, count: int) -> None:
        """Until `count` requests have arrived (bound it with `asyncio.timeout`)."""
        while len(self.received) < count:
            self.arrived.clear()
            await self.arrived.wait()

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"http://{host}:{self.port}{path}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.received.append(Received(path, headers, body))
            self.arrived.set()
            code = self.statuses.pop(0) if self.statuses else 200
            writer.write(
                f"HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode()
            )
            await writer.drain()
        finally:
            writer.close()


@asynccontextmanager
async def receiver(statuses: list[int] | None = None) -> AsyncIterator[Receiver]:
    rec = Receiver(statuses=list(statuses or []))
    server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    rec.port = server.sockets[0].getsockname()[1]
    async with server:
        yield rec


def verify(secret: str, header: str, body: bytes) -> bool:
    """The receiver side of the deprecated `Sandhive-Signature`: any of its `v1=` (several
    during a rotation's overlap) made with `secret`."""
    fields = [item.split("=", 1) for item in header.split(",")]
    stamp = dict(fields)["t"]
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, v) for name, v in fields if name == "v1")
