"""One command of a `/v1/sandboxes` sandbox, run through its exec channel.

Its output is kept up to the request's cap (the head; `*_truncated` past it). Streamed, each
piece kept is forwarded on the reply key at once, never waiting for the reader: when the
reader has fallen `READ_AHEAD` pieces behind, further output is dropped and the stream marked
truncated, so a caller that stops reading costs the worker nothing (waiting would let the
channel's queue, shared by the sandbox's other commands, grow without bound).
"""

from __future__ import annotations

import base64
import time
from typing import Any

from redis.asyncio import Redis

from app import metrics
from app.bus import files as bus
from app.sandbox.docker import DockerSandbox

READ_AHEAD = 16
"""Pieces of a stream waiting in Redis for their reader, at most."""


class _Head:
    """The first `cap` bytes of a stream, and whether any were dropped."""

    def __init__(self, cap: int) -> None:
        self.cap, self.kept, self.truncated = cap, bytearray(), False

    def add(self, data: bytes) -> bytes:
        """Keep what fits; the part kept."""
        kept = data[: max(self.cap - len(self.kept), 0)]
        self.kept += kept
        if len(kept) < len(data):
            self.truncated = True
        return kept


async def run(
    box: DockerSandbox, request: dict[str, Any], redis: Redis, reply: str, default_cap: int
) -> dict[str, Any]:
    """Run the request's command to its end or timeout; the `exit` answer (outputs in it
    unless streamed)."""
    cap = int(request.get("max_output") or default_cap)
    heads = {"stdout": _Head(cap), "stderr": _Head(cap)}
    stream = bool(request.get("stream"))

    async def on_output(name: str, data: bytes) -> None:
        head = heads["stderr" if name == "stderr" else "stdout"]
        kept = head.add(data)
        if not stream or not kept:
            return
        if await redis.llen(reply) >= READ_AHEAD:
            head.truncated = True  # the reader lags: this piece is dropped
            return
        piece = {"stream": name, "data": base64.b64encode(kept).decode()}
        await bus.answer(redis, reply, {"output": piece})

    stdin = request.get("stdin")
    started = time.monotonic()
    done = await box.exec(
        [str(arg) for arg in request["argv"]],
        workdir=str(request.get("cwd") or box.config.workdir),
        env={str(k): str(v) for k, v in (request.get("env") or {}).items()},
        stdin=base64.b64decode(stdin) if stdin is not None else None,
        timeout_s=float(request["timeout_s"]),
        on_output=on_output,
        user=request.get("user"),
    )
    seconds = time.monotonic() - started
    metrics.SANDBOX_COMMANDS.inc()
    metrics.SANDBOX_COMMAND_SECONDS.observe(seconds)
    out, err = heads["stdout"], heads["stderr"]
    return {
        "exit": {
            "exit_code": None if done.timed_out else done.exit_code,
            "timed_out": done.timed_out,
            "stdout": "" if stream else base64.b64encode(out.kept).decode(),
            "stderr": "" if stream else base64.b64encode(err.kept).decode(),
            "stdout_truncated": out.truncated,
            "stderr_truncated": err.truncated,
            "duration_ms": int(seconds * 1000),
        }
    }
