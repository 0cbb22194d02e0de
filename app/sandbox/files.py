"""Tar in and out of a sandbox: build archives we trust, read archives we do not.

Pure helpers (no Docker) used by `app.sandbox.docker`. The archive read back
from a container is hostile: only regular files come out, names are confined
to the source directory, and every cap is enforced while reading, never after.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

BLOCK = 512
MAX_META_BYTES = 64 * 2**10
"""Cap on one pax/GNU long-name header; real ones are a few hundred bytes."""
MAX_SKIPPED_LISTED = 1000
MAX_PATH_CHARS = 1024
"""Longer artifact paths are skipped: they could not be stored or served sensibly."""
SKIP_CHUNK = 2**16

_TYPE_REASONS = {
    b"1": "hardlink",
    b"2": "symlink",
    b"3": "device",
    b"4": "device",
    b"6": "fifo",
}
_REGULAR = {b"0", b"\0", b"7"}
_DIRECTORY = b"5"


@dataclass(frozen=True)
class CollectCaps:
    max_files: int
    max_file_bytes: int
    max_total_bytes: int
    max_archive_bytes: int | None = None
    """Bytes read from the stream in all, skipped data included; None: max(4 x total, 1 GiB)."""

    @property
    def archive_budget(self) -> int:
        """How much of the archive we are willing to read before giving up."""
        if self.max_archive_bytes is not None:
            return self.max_archive_bytes
        return max(4 * self.max_total_bytes, 2**30)


@dataclass(frozen=True)
class CollectedFile:
    path: str
    content: bytes


@dataclass
class Collected:
    files: list[CollectedFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason); archive-level problems use the path ""."""


class ByteSource(Protocol):
    """What we read a tar from: aiohttp's and asyncio's StreamReader both fit."""

    async def readexactly(self, n: int) -> bytes: ...


class ArchiveError(Exception):
    """The archive is malformed or over budget; reading stops."""


def normalize_relpath(path: str) -> str:
    """A safe relative path ("a/b.txt"), or ValueError for absolute, `..`, empty segments, NUL."""
    if not path or path.startswith("/") or "\0" in path:
        raise ValueError(f"invalid relative path {path!r}")
    parts = [p for p in path.split("/") if p != "."]
    if not parts or any(p in ("", "..") for p in parts):
        raise ValueError(f"invalid relative path {path!r}")
    return "/".join(parts)


def build_tar(files: Sequence[tuple[str, bytes]]) -> bytes:
    """An uncompressed tar of files (root-owned, 0644) with their parent dirs (0755)."""
    buf = io.BytesIO()
    now = time.time()
    seen_dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for raw_path, content in files:
            path = normalize_relpath(raw_path)
            for parent in _parents(path):
                if parent not in seen_dirs:
                    seen_dirs.add(parent)
                    tar.addfile(_tarinfo(parent, tarfile.DIRTYPE, 0o755, 0, now))
            info = _tarinfo(path, tarfile.REGTYPE, 0o644, len(content), now)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _tarinfo(name: str, kind: bytes, mode: int, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


@dataclass
class Member:
    """One tar entry after pax/GNU long-name headers have been applied."""

    name: str
    linkname: str
    size: int
    kind: bytes


class TarStream:
    """Reads tar headers and data from a ByteSource, holding at most one member's data."""

    def __init__(self, source: ByteSource, budget: int) -> None:
        self._source = source
        self._budget = budget
        self._pending = 0  # data + padding of the last member not yet consumed
        self.bytes_read = 0

    async def _read(self, n: int) -> bytes:
        if self.bytes_read + n > self._budget:
            raise ArchiveError("archive read limit reached")
        self.bytes_read += n
        return await self._source.readexactly(n)

    async def next_member(self) -> Member | None:
        """The next member, or None at the end-of-archive marker."""
        await self.skip_data()
        overrides: dict[str, str] = {}
        while True:
            block = await self._read(BLOCK)
            if block == bytes(BLOCK):
                return None
            name, linkname, size, kind = _parse_header(block)
            if kind not in (b"x", b"g", b"L", b"K"):
                self._pending = _padded(size)
                return Member(
                    overrides.get("path", name), overrides.get("linkpath", linkname), size, kind
                )
            if size > MAX_META_BYTES:
                raise ArchiveError("tar metadata header too large")
            meta = (await self._read(_padded(size)))[:size]
            _apply_meta(kind, meta, overrides)

    async def read_data(self, size: int) -> bytes:
        """The current member's content (size must be its header size)."""
        data = await self._read(_padded(size))
        self._pending = 0
        return data[:size]

    async def skip_data(self) -> None:
        """Discard the rest of the current member in small pieces."""
        while self._pending:
            step = min(self._pending, SKIP_CHUNK)
            await self._read(step)
            self._pending -= step


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _parse_header(block: bytes) -> tuple[str, str, int, bytes]:
    stored = _octal(block[148:156])
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != computed:
        raise ArchiveError("corrupt tar header (checksum)")
    name = _cstr(block[0:100])
    if block[257:265] == b"ustar\x0000" and block[345]:
        name = _cstr(block[345:500]) + "/" + name
    return name, _cstr(block[157:257]), _size(block[124:136]), block[156:157]


def _cstr(field_bytes: bytes) -> str:
    return field_bytes.split(b"\0", 1)[0].decode("utf-8", "replace")


def _octal(field_bytes: bytes) -> int:
    text = field_bytes.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError as exc:
        raise ArchiveError("corrupt tar header (number)") from exc


def _size(field_bytes: bytes) -> int:
    if field_bytes[0] & 0x80:  # GNU base-256 for sizes past 8 GiB
        if field_bytes[0] == 0xFF:
            raise ArchiveError("corrupt tar header (negative size)")
        return int.from_bytes(bytes([field_bytes[0] & 0x7F]) + field_bytes[1:], "big")
    return _octal(field_bytes)


def _apply_meta(kind: bytes, meta: bytes, overrides: dict[str, str]) -> None:
    if kind == b"L":
        overrides["path"] = _cstr(meta)
    elif kind == b"K":
        overrides["linkpath"] = _cstr(meta)
    elif kind == b"x":
        overrides.update(_pax_records(meta))


def _pax_records(meta: bytes) -> dict[str, str]:
    """Parse "<len> key=value\\n" records; only path and linkpath matter to us."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(meta):
        space = meta.find(b" ", pos)
        length_text = meta[pos:space] if space > pos else b""
        if not length_text.isdigit() or int(length_text) <= space - pos:
            raise ArchiveError("corrupt pax header")
        length = int(length_text)
        key, _, value = meta[space + 1 : pos + length - 1].partition(b"=")
        if key in (b"path", b"linkpath"):
            records[key.decode()] = value.decode("utf-8", "replace")
        pos += length
    return records


class Collector:
    """Decides, member by member, what comes out of the archive (the caps live here)."""

    def __init__(self, src_dir: str, caps: CollectCaps) -> None:
        self.root = posixpath.basename(posixpath.normpath(src_dir))
        self.caps = caps
        self.result = Collected()
        self.total = 0
        self.seen: set[str] = set()

    def relative(self, name: str) -> str | None:
        """The path below the source directory, "" for the directory itself, None if outside."""
        if name.startswith("/"):
            return None
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or ".." in parts or parts[0] != self.root:
            return None
        return "/".join(parts[1:])

    def skip(self, path: str, reason: str) -> None:
        """Record a skipped entry, listing at most MAX_SKIPPED_LISTED of them."""
        skipped = self.result.skipped
        if len(skipped) < MAX_SKIPPED_LISTED:
            skipped.append((path, reason))
        elif len(skipped) == MAX_SKIPPED_LISTED:
            skipped.append(("", "more entries skipped"))

    def admit(self, member: Member) -> str | None:
        """The path to keep this member's content under; None to skip it. StopCollect ends it."""
        rel = self.relative(member.name)
        if rel is None:
            self.skip(member.name, "outside source directory")
            return None
        if member.kind == _DIRECTORY:
            return None
        path = rel or self.root  # src_dir may itself be a single file
        if member.kind not in _REGULAR:
            self.skip(path, _TYPE_REASONS.get(member.kind, "unsupported type"))
            return None
        return self._admit_regular(path, member.size)

    def _admit_regular(self, path: str, size: int) -> str | None:
        caps = self.caps
        if len(path) > MAX_PATH_CHARS or "\0" in path or "\ufffd" in path:
            self.skip(path[:MAX_PATH_CHARS], "unusable file name")
            return None
        if path in self.seen:  # a hostile archive may repeat a member
            self.skip(path, "duplicate entry")
            return None
        if len(self.result.files) >= caps.max_files:
            raise StopCollect(path, "file limit reached")
        if size > caps.max_file_bytes:
            self.skip(path, "too large")
            return None
        if self.total + size > caps.max_total_bytes:
            raise StopCollect(path, "total size limit reached")
        self.total += size
        self.seen.add(path)
        return path

    def add(self, path: str, content: bytes) -> None:
        self.result.files.append(CollectedFile(path, content))


class StopCollect(Exception):
    """A cap that ends the collection (the rest of the archive is not read)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(reason)
        self.path, self.reason = path, reason


async def collect_tar(source: ByteSource, src_dir: str, caps: CollectCaps) -> Collected:
    """Regular files under src_dir from a tar stream, within caps; problems go to `skipped`."""
    stream = TarStream(source, caps.archive_budget)
    collector = Collector(src_dir, caps)
    try:
        while (member := await stream.next_member()) is not None:
            path = collector.admit(member)
            if path is not None:
                collector.add(path, await stream.read_data(member.size))
    except StopCollect as stop:
        collector.skip(stop.path, stop.reason)
    except ArchiveError as exc:
        collector.skip("", str(exc))
    except EOFError:  # asyncio.IncompleteReadError: the stream ended mid-archive
        collector.skip("", "truncated archive")
    return collector.result
