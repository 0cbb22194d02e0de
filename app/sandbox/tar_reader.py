"""Reading a tar stream we do not trust, member by member, never holding all of it.

Docker frames `GET /containers/{id}/archive`, but every name and every byte of
content in it is the agent's. The headers are parsed by `tarfile` itself (PAX
`size`, `path` and `linkpath` records, GNU long names, base-256 numbers), over
a window on the bytes read so far: when it asks for bytes not read yet, more
are read from the async source (at most `MAX_HEADER_BYTES` per member) and the
member's headers are parsed again. So nothing blocks the event loop and no
thread is needed. On top come the checks `tarfile` leaves out: a malformed PAX
size is an error (tarfile would take 0 and read the content as headers), sparse
members end the read (Docker never sends them, and their framing is not worth
trusting), and anything but zeros after the end-of-archive marker is reported.
Imported by `app.sandbox.files`.
"""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

BLOCK = tarfile.BLOCKSIZE
MAX_HEADER_BYTES = 64 * 2**10
"""Cap on one member's headers, PAX and GNU records included; real ones are a few hundred bytes."""
READ_AHEAD = 2**16
SKIP_CHUNK = 2**16
SPARSE = tarfile.GNUTYPE_SPARSE
"""The kind of every sparse member, GNU or PAX."""

_ZERO_BLOCK = bytes(BLOCK)
_DECIMAL = re.compile(r"[0-9]{1,20}")
_FRAMING_KEYS = frozenset({"path", "linkpath", "size"})
"""PAX keys that would rename or resize every later member if given in a global header."""


class ByteSource(Protocol):
    """What we read a tar from: aiohttp's and asyncio's StreamReader both fit."""

    async def read(self, n: int) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...


class ArchiveError(Exception):
    """The archive is malformed, cut short or over budget; reading stops."""


@dataclass(frozen=True)
class Member:
    """One entry of the archive after its PAX/GNU headers were applied."""

    name: str
    size: int
    kind: bytes
    """The tar type flag; `SPARSE` for every sparse member."""


class TarReader:
    """Members and their data from a ByteSource, reading at most `budget` bytes in all."""

    def __init__(self, source: ByteSource, budget: int) -> None:
        self._source = source
        self._budget = budget
        self._buf = bytearray()  # read from the source, not consumed yet
        self._pending = 0  # data and padding of the current member not consumed yet
        self._stop: str | None = None
        self.bytes_read = 0

    async def next_member(self) -> Member | None:
        """The next member, or None at the end-of-archive marker (checked to end the stream)."""
        if self._stop is not None:
            raise ArchiveError(self._stop)
        await self.skip_data()
        await self._fill(BLOCK)
        if self._buf[:BLOCK] == _ZERO_BLOCK:
            await self._check_end()
            return None
        member, header_len, data_len = await self._parse()
        del self._buf[:header_len]
        self._pending = data_len
        if member.kind == SPARSE:
            self._stop = "sparse file in the archive: the rest was not read"
        return member

    async def read_data(self, size: int) -> bytes:
        """The current member's content; `size` is its `Member.size`."""
        if size > self._pending:
            raise ValueError("read past the current member")
        have = min(size, len(self._buf))
        head = bytes(self._buf[:have])
        del self._buf[:have]
        self._pending -= size
        rest = size - have
        if not rest:
            return head
        self._charge(rest)
        try:
            return head + await self._source.readexactly(rest)
        except asyncio.IncompleteReadError:
            raise ArchiveError("truncated archive") from None

    async def skip_data(self) -> None:
        """Discard what is left of the current member; refuse at once if over the budget."""
        have = min(self._pending, len(self._buf))
        del self._buf[:have]
        self._pending -= have
        self._charge(self._pending)
        while self._pending:
            chunk = await self._source.read(min(self._pending, SKIP_CHUNK))
            if not chunk:
                raise ArchiveError("truncated archive")
            self.bytes_read += len(chunk)
            self._pending -= len(chunk)

    async def _parse(self) -> tuple[Member, int, int]:
        """(member, bytes of its headers, bytes of its data and padding) at the buffer's start.

        Parsed from a copy of the buffer's first bytes, grown while tarfile asks for more.
        """
        window = 4 * BLOCK
        while True:
            try:
                return parse_headers(bytes(self._buf[:window]))
            except _NeedMore as more:
                upto = more.upto
            if upto > MAX_HEADER_BYTES:
                raise ArchiveError("tar metadata header too large")
            await self._fill(upto)
            window = max(upto, 2 * window)

    async def _fill(self, n: int) -> None:
        """Read until the buffer holds n bytes, taking what else has arrived (up to READ_AHEAD)."""
        while len(self._buf) < n:
            need = n - len(self._buf)
            self._charge(need)
            left = self._budget - self.bytes_read
            chunk = await self._source.read(min(max(need, READ_AHEAD), left))
            if not chunk:
                raise ArchiveError("truncated archive")
            self.bytes_read += len(chunk)
            self._buf += chunk

    async def _check_end(self) -> None:
        """Only zeros may follow the marker (Go writes two zero blocks, Python pads a record):
        anything else means the framing went wrong somewhere, so members may be missing."""
        while True:
            if self._buf.count(0) != len(self._buf):
                raise ArchiveError("data after the end-of-archive marker")
            self._buf.clear()
            left = self._budget - self.bytes_read
            chunk = await self._source.read(min(SKIP_CHUNK, left)) if left else b""
            if not chunk:
                return
            self.bytes_read += len(chunk)
            self._buf += chunk

    def _charge(self, n: int) -> None:
        if self.bytes_read + n > self._budget:
            raise ArchiveError("archive read limit reached")


def parse_headers(data: bytes) -> tuple[Member, int, int]:
    """The member whose headers start `data`, the bytes of its headers, of its data and padding.

    Raises `_NeedMore` when tarfile asks for bytes past the end of `data`.
    """
    window = _Window(data)
    try:
        tar = tarfile.TarFile(fileobj=window, encoding="utf-8", errors="surrogateescape")
        info = tar.next()
    except (tarfile.TarError, ValueError, RecursionError) as exc:
        raise ArchiveError(f"corrupt tar header ({exc})") from None
    if info is None:  # only when `data` starts with a zero block, which the caller rules out
        raise ArchiveError("corrupt tar header (end-of-archive marker)")
    if _FRAMING_KEYS.intersection(tar.pax_headers) or _sparse_keys(tar.pax_headers):
        raise ArchiveError("unsupported global pax header")
    header_len = window.tell()
    if info.issparse() or info.type == SPARSE or _sparse_keys(info.pax_headers):
        return Member(info.name, 0, SPARSE), header_len, 0
    size = _checked_size(info)
    has_data = info.isreg() or info.type not in tarfile.SUPPORTED_TYPES
    return Member(info.name, size, info.type), header_len, _padded(size) if has_data else 0


def _checked_size(info: tarfile.TarInfo) -> int:
    """The size, refusing what tarfile lets pass: a negative one, a PAX size it read as 0."""
    if info.size < 0:
        raise ArchiveError("corrupt tar header (negative size)")
    record = info.pax_headers.get("size")
    if record is not None and (not _DECIMAL.fullmatch(record) or int(record) != info.size):
        raise ArchiveError("corrupt pax header (size)")
    return info.size


def _sparse_keys(pax_headers: Mapping[str, str]) -> bool:
    return any(key.startswith("GNU.sparse.") for key in pax_headers)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


class _NeedMore(Exception):
    """tarfile asked for bytes not read yet: read up to `upto` and parse again."""

    def __init__(self, upto: int) -> None:
        super().__init__(upto)
        self.upto = upto


class _Window:
    """The bytes read so far, as the forward-only, read-only file tarfile reads headers from."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def read(self, size: int = -1, /) -> bytes:
        end = self._pos + size if size >= 0 else MAX_HEADER_BYTES + 1
        if end > len(self._data):
            raise _NeedMore(end)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, /) -> object:
        raise io.UnsupportedOperation("a tar stream only goes forward")

    def write(self, b: bytes, /) -> object:
        raise io.UnsupportedOperation("read-only")

    def close(self) -> None:
        """Nothing to release: the window does not own its bytes."""
