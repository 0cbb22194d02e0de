"""A running sandbox's files for the worker's file service: list a directory, stream a file
out, write one in.

Each call runs `app/sandbox/file_agent.py` inside the container (through the exec channel
when it runs), which resolves the path with the sandbox's own view and refuses anything
outside `writable_roots`. What it prints is hostile like everything else from a sandbox:
the header line is bounded, parsed as a JSON object, and a read forwards no more bytes
than the size it announced (itself within the cap). Imported by `app.worker.files`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from app.sandbox.docker import DockerSandbox
from app.sandbox.policy import SCRATCH_DIRS

AGENT_SOURCE = (Path(__file__).parent / "file_agent.py").read_text()
HEADER_BYTES = 64 * 1024
"""A read's or a write's header line (and a listing's, before its entries) must fit."""
ENTRY_BYTES = 2048
"""Room per listed entry: a 255-byte name JSON-escaped at worst, its type, size and mtime."""
Header = dict[str, Any]
OnChunk = Callable[[bytes], Awaitable[None]]
OnHeader = Callable[[Header], Awaitable[None]]


class FileRefused(Exception):
    """The sandbox said no (`kind`: outside, missing, not_file, not_dir, too_large, os) or
    could not be asked (`failure`, `timeout`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def writable_roots(box: DockerSandbox) -> list[str]:
    """Where a file request may land: the workdir and the scratch tmpfs dirs."""
    return [box.config.workdir, *SCRATCH_DIRS]


def in_sandbox(box: DockerSandbox, path: str) -> str:
    """The absolute path a request's path names: relative ones are below the workdir."""
    return path if path.startswith("/") else posixpath.join(box.config.workdir, path)


async def list_dir(
    box: DockerSandbox, path: str, *, max_entries: int, timeout_s: float, anywhere: bool = False
) -> Header:
    """The sandbox's listing of `path` (unvalidated: the caller checks its shape).
    `anywhere`: any path of the sandbox's (a caller's own sandbox), not only the writable
    area of a task's."""
    reader = _Reader(None, None, max_header=HEADER_BYTES + max_entries * ENTRY_BYTES)
    await _run(box, "list", path, max_entries, None, reader, timeout_s, anywhere)
    return reader.result()


async def read_file(
    box: DockerSandbox,
    path: str,
    *,
    max_bytes: int,
    timeout_s: float,
    on_header: OnHeader,
    on_chunk: OnChunk,
    anywhere: bool = False,
) -> int:
    """Stream the file: `on_header` ({size, mtime}) once, then `on_chunk` as bytes come.

    Returns the bytes forwarded; FileRefused before `on_header` when the sandbox refused.
    """
    reader = _Reader(on_header, on_chunk, budget=max_bytes)
    await _run(box, "read", path, max_bytes, None, reader, timeout_s, anywhere)
    reader.result()
    return reader.sent


async def write_file(
    box: DockerSandbox,
    path: str,
    content: bytes,
    *,
    max_bytes: int,
    timeout_s: float,
    anywhere: bool = False,
) -> Header:
    """Write `content` at `path` (parents made, replaced atomically); the sandbox's answer."""
    reader = _Reader(None, None)
    await _run(box, "write", path, max_bytes, content, reader, timeout_s, anywhere)
    return reader.result()


async def _run(
    box: DockerSandbox,
    op: str,
    path: str,
    cap: int,
    stdin: bytes | None,
    reader: _Reader,
    timeout_s: float,
    anywhere: bool,
) -> None:
    # Anywhere: the whole filesystem as the sandbox sees it, its root's reads and writes held
    # to the file's owner bits (`file_agent.owner_may`), as a harness's own sandbox expects.
    roots = json.dumps(["/"] if anywhere else writable_roots(box))
    # -I: no user site, no PYTHON* variables, no script dir on sys.path; a usercustomize or
    # .pth the agent planted under its writable /root must not run in every file request.
    argv = ["python3", "-I", "-c", AGENT_SOURCE, op, in_sandbox(box, path), roots, str(cap)]
    if anywhere:
        argv.append("owner-bits")
    done = await box.exec(
        argv, workdir="/", stdin=stdin, timeout_s=timeout_s, on_output=reader.feed
    )
    if done.timed_out:
        raise FileRefused("timeout", f"the sandbox took over {timeout_s:g} s to {op} {path}")
    if reader.header is None:
        detail = done.stderr.decode(errors="replace")[-500:].strip()
        raise FileRefused(
            "failure", f"the sandbox could not {op} {path} (exit {done.exit_code}): {detail}"
        )


class _Reader:
    """Splits the agent's stdout into its header line and (for a read) the file's bytes."""

    def __init__(
        self,
        on_header: OnHeader | None,
        on_chunk: OnChunk | None,
        budget: int = 0,
        max_header: int = HEADER_BYTES,
    ) -> None:
        self._on_header, self._on_chunk = on_header, on_chunk
        self._buf = bytearray()
        self._scanned = 0
        self._max_header = max_header
        self._budget = budget
        self.header: Header | None = None
        self.sent = 0
        self.forged = False

    async def feed(self, stream: str, data: bytes) -> None:
        if stream != "stdout" or self.forged:
            return
        if self.header is None:
            data = await self._head(data)
        if data and self._on_chunk is not None:
            data = data[: max(self._budget - self.sent, 0)]
            if data:
                self.sent += len(data)
                await self._on_chunk(data)

    async def _head(self, data: bytes) -> bytes:
        """Collect the header line; the bytes after it (none until it is complete)."""
        self._buf += data
        end = self._buf.find(b"\n", self._scanned)  # only the new bytes: no quadratic scan
        self._scanned = len(self._buf)
        if end < 0 or end > self._max_header:
            if len(self._buf) > self._max_header:
                self.forged = True
                self._buf.clear()
            return b""
        try:
            header = json.loads(bytes(self._buf[:end]))
        except ValueError:
            header = None
        rest = bytes(self._buf[end + 1 :])
        self._buf.clear()
        if not isinstance(header, dict):
            self.forged = True
            return b""
        self.header = header
        if "error" not in header and self._on_header is not None:
            size = header.get("size")
            if not isinstance(size, int) or not 0 <= size <= self._budget:
                self.forged = True
                return b""
            self._budget = size
            await self._on_header(header)
        return rest

    def result(self) -> Header:
        """The header, or FileRefused for a refusal or output that is not the agent's."""
        if self.forged or self.header is None:
            raise FileRefused("failure", "the sandbox answered something unreadable")
        if "error" in self.header:
            kind, message = self.header.get("error"), self.header.get("message")
            raise FileRefused(str(kind)[:40], str(message)[:2000])
        return self.header
