"""The host end of the exec channel: one long-lived `docker exec` per sandbox, many commands.

`ExecChannel.open` starts `app/sandbox/channel_agent.py` inside a running container
(its source passed to `python3 -I -S -c`, so any image with python3 works and nothing is
written into the container) and keeps that one exec's stdin/stdout open; each
`exec` is then a framed request on it instead of a new `docker exec` (~1 ms instead
of ~60-80 ms). Returns None when the agent cannot start (no python3, say): the
caller keeps the per-command `docker exec` path. Imported by `app.sandbox.docker`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import struct
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.stream import Stream

from app.agent.types import ExecResult, OutputCallback
from app.errors import SandboxError
from app.sandbox.capture import OutputCapture

AGENT_SOURCE = (Path(__file__).parent / "channel_agent.py").read_text()
AGENT_FLAGS = ("-I", "-S")
"""The agent needs only the standard library: isolated (no PYTHON* variables of the image,
no user site) and without `site`, whose start is ~1 ms of every sandbox's CPU."""
HEAD = struct.Struct(">II")
MARK = "SANDHIVE_EXEC_ID"
READY_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 15.0
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 1024 * 1024
"""The agent sends output in chunks of at most 64 KiB; anything far bigger is forged."""
Frame = tuple[dict[str, Any], bytes]
log = logging.getLogger(__name__)
_LIVE: set[ExecChannel] = set()
"""Open channels, so a reader task is never garbage-collected while its stream is open."""


LOST_MESSAGE = b"\nsandhive: lost this command: the sandbox's command runner was stopped\n"


class ChannelClosed(SandboxError):
    """The channel was already closed when a command was sent: nothing ran."""


class ChannelLost(SandboxError):
    """The channel closed while a command ran: its outcome is unknown."""


class ExecChannel:
    """Framed requests to the in-sandbox agent; safe for concurrent `exec` calls."""

    def __init__(self, stack: AsyncExitStack, stream: Stream, cap_bytes: int) -> None:
        self._stack = stack
        self._stream = stream
        self._cap = cap_bytes
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Queue[Frame | None]] = {}
        self._ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._write_lock = asyncio.Lock()
        self._sessions: dict[str, asyncio.Lock] = {}
        self.alive = True
        self._reader = asyncio.create_task(self._read())
        _LIVE.add(self)

    @classmethod
    async def open(
        cls, container: DockerContainer, cap_bytes: int, interpreter: str = "python3"
    ) -> ExecChannel | None:
        """Start the agent in the container; None when it does not come up."""
        stack = AsyncExitStack()
        try:
            run = await container.exec(
                [interpreter, *AGENT_FLAGS, "-c", AGENT_SOURCE],
                stdin=True,
                workdir="/",
                environment={},
            )
            stream: Stream = run.start(detach=False)
            await stream.__aenter__()
            stack.push_async_callback(stream.close)
            channel = cls(stack, stream, cap_bytes)
            if await channel.wait_ready(READY_TIMEOUT_S):
                return channel
            # No python3, or one that cannot start isolated (`-I` ignores PYTHONHOME).
            log.info("exec channel agent exited before it was ready, using docker exec")
            await channel.close()
        except (DockerError, OSError, RuntimeError) as exc:  # OSError covers TimeoutError
            log.info("exec channel unavailable, using docker exec: %r", exc)
            await stack.aclose()
        return None

    async def wait_ready(self, timeout_s: float) -> bool:
        """True once the agent said it is ready, False when its stream ended first;
        TimeoutError when it said neither within timeout_s."""
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(self._ready)  # a timeout leaves it for a next wait

    async def exec(
        self,
        argv: Sequence[str],
        *,
        workdir: str,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        timeout_s: float | None,
        on_output: OutputCallback | None,
        linger_s: float | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run argv through the agent: same contract as `DockerSandbox.exec`."""
        request = {
            "op": "run",
            "argv": list(argv),
            "cwd": workdir,
            "env": {**(env or {}), MARK: secrets.token_hex(12)},
            "stdin": stdin is not None,
            "linger": linger_s,
            "user": user,
        }
        return await self._request(request, stdin or b"", timeout_s, on_output, session=False)

    async def shell(
        self,
        session: str,
        command: str,
        *,
        workdir: str,
        timeout_s: float | None,
        on_output: OutputCallback | None,
        linger_s: float | None = None,
    ) -> ExecResult:
        """Run command in the agent's persistent bash named session (started in workdir).

        One command at a time per session: a second call waits for the first.
        """
        lock = self._sessions.setdefault(session, asyncio.Lock())
        async with lock:
            request = {
                "op": "shell",
                "session": session,
                "command": command,
                "cwd": workdir,
                "env": {MARK: secrets.token_hex(12)},
                "linger": linger_s,
            }
            return await self._request(request, b"", timeout_s, on_output, session=True)

    async def _request(
        self,
        request: dict[str, Any],
        stdin: bytes,
        timeout_s: float | None,
        on_output: OutputCallback | None,
        *,
        session: bool,
    ) -> ExecResult:
        """Send one command request and collect its output; `session`: a shell op."""
        rid = request["id"] = next(self._ids)
        queue: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._waiting[rid] = queue
        out, err = OutputCapture(self._cap), OutputCapture(self._cap)
        try:
            await self._send(request, stdin)
            async with asyncio.timeout(timeout_s):
                code, ended = await _collect(queue, out, err, on_output)
        except ChannelLost:
            # The agent was killed (`pkill python3`, say) while the command ran: the model
            # hears it like any failed command, and the sandbox goes on with `docker exec`.
            err.add(LOST_MESSAGE)
            return ExecResult(126, out.value(), err.value(), session_ended=session)
        except TimeoutError:
            ended = await self._kill(rid, queue) and session
            return ExecResult(-1, out.value(), err.value(), timed_out=True, session_ended=ended)
        except asyncio.CancelledError:
            await self._kill(rid, queue)  # the command must not outlive the call
            raise
        finally:
            self._waiting.pop(rid, None)
        return ExecResult(code, out.value(), err.value(), session_ended=ended and session)

    async def _kill(self, rid: int, queue: asyncio.Queue[Frame | None]) -> bool:
        """Ask the agent to SIGKILL the command's tree and wait until it says it did.

        True when a shell session went with it (or the channel did).
        """
        with suppress(SandboxError, TimeoutError):
            async with asyncio.timeout(KILL_TIMEOUT_S):
                await self._send({"op": "kill", "id": rid}, b"")
                while (frame := await queue.get()) is not None:
                    if "killed" in frame[0] or "exit" in frame[0]:
                        return bool(frame[0].get("ended"))
        return True

    async def _send(self, header: Mapping[str, Any], payload: bytes) -> None:
        if not self.alive:
            raise ChannelClosed("exec channel closed")
        data = json.dumps(header).encode()
        try:
            async with self._write_lock:
                await self._stream.write_in(HEAD.pack(len(data), len(payload)) + data + payload)
        except (OSError, RuntimeError, AssertionError) as exc:
            raise SandboxError(f"exec channel write failed: {exc!r}") from exc

    async def _read(self) -> None:
        """Split the agent's stdout into frames and hand each to its command's queue."""
        buf = bytearray()
        try:
            while (message := await self._stream.read_out()) is not None:
                if message.stream == 2:
                    log.debug("channel agent: %r", message.data[-500:])
                    continue
                buf += message.data
                while len(buf) >= HEAD.size:
                    size, length = HEAD.unpack_from(buf)
                    if size > MAX_HEADER_BYTES or length > MAX_PAYLOAD_BYTES:
                        # Only a forged frame is this big (sandboxed code can write to the
                        # agent's stdout): drop the channel rather than buffer it here.
                        raise ValueError(f"oversized frame from the sandbox ({size}, {length})")
                    if len(buf) < HEAD.size + size + length:
                        break
                    header = json.loads(bytes(buf[HEAD.size : HEAD.size + size]))
                    payload = bytes(buf[HEAD.size + size : HEAD.size + size + length])
                    del buf[: HEAD.size + size + length]
                    self._dispatch(header, payload)
        except Exception as exc:  # the stream broke: every waiting command fails below
            log.warning("exec channel lost: %r", exc)
        finally:
            self.alive = False
            if not self._ready.done():
                self._ready.set_result(False)
            for queue in self._waiting.values():
                queue.put_nowait(None)
            _LIVE.discard(self)
            with suppress(Exception):
                await self._stack.aclose()  # the container is gone or the channel closed

    def _dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        if "ready" in header:
            if not self._ready.done():
                self._ready.set_result(True)
            return
        queue = self._waiting.get(int(header.get("id", 0)))
        if queue is not None:
            queue.put_nowait((header, payload))

    async def close(self) -> None:
        """Close the stream (the agent exits at EOF) and stop reading."""
        self.alive = False
        with suppress(Exception):
            await self._stack.aclose()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


async def _collect(
    queue: asyncio.Queue[Frame | None],
    out: OutputCapture,
    err: OutputCapture,
    on_output: OutputCallback | None,
) -> tuple[int, bool]:
    """Output chunks until the exit frame; the exit code and whether a shell session ended."""
    while (frame := await queue.get()) is not None:
        header, payload = frame
        if "exit" in header:
            return int(header["exit"]), bool(header.get("ended"))
        name = header.get("stream")
        if name in ("stdout", "stderr"):
            (out if name == "stdout" else err).add(payload)
            if on_output is not None:
                await on_output(name, payload)
    raise ChannelLost("exec channel closed while a command ran")
