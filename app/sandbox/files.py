"""Tar in and out of a sandbox: build archives we trust, read archives we do not.

Pure helpers (no Docker) used by `app.sandbox.docker`. The archive read back
from a container is hostile (`app.sandbox.tar_reader` frames it): only regular
files come out, names are confined to the source directory and must be
printable (so that every one listed can be served), and every cap is enforced while
reading, never after. Each member is kept byte for byte or listed as skipped.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.sandbox.tar_reader import SPARSE, ArchiveError, ByteSource, Member, TarReader

MAX_SKIPPED_LISTED = 1000
MAX_PATH_CHARS = 1024
"""Longer artifact paths are skipped: they could not be stored or served sensibly."""

_TYPE_REASONS = {
    b"1": "hardlink",
    b"2": "symlink",
    b"3": "device",
    b"4": "device",
    b"6": "fifo",
    SPARSE: "sparse file",
}
_REGULAR = {b"0", b"\0", b"7"}
_DIRECTORY = b"5"
_UNUSABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
"""Control characters (C0, DEL, C1) and undecodable bytes (surrogate escapes): a name with
one is skipped, since routes, headers, logs, terminals and `sandhive run`'s local copy would
each mangle or refuse it (a newline alone made a listed artifact answer 404)."""


@dataclass(frozen=True)
class CollectCaps:
    max_files: int
    max_file_bytes: int
    max_total_bytes: int
    max_archive_bytes: int | None = None
    """Bytes read from the stream in all, skipped data included; None: max(4 x total, 1 GiB)."""
    max_channel_bytes: int = 32 * 2**20
    """Bytes of tar taken through the exec channel before the archive API takes over
    (`app.sandbox.channel_collect`: the channel's frames have no backpressure)."""

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
        """Record a skipped entry (its path made printable), listing at most MAX_SKIPPED_LISTED."""
        skipped = self.result.skipped
        if len(skipped) < MAX_SKIPPED_LISTED:
            skipped.append((printable(path)[:MAX_PATH_CHARS], reason))
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
        if len(path) > MAX_PATH_CHARS or _UNUSABLE.search(path):
            self.skip(path, "unusable file name")
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
    """Regular files under src_dir from a tar stream, within caps; problems go to `skipped`.

    Every member is either kept byte for byte or skipped with a reason; when reading
    stops early, an entry with the path "" says why (the members after it are not read).
    """
    reader = TarReader(source, caps.archive_budget)
    collector = Collector(src_dir, caps)
    try:
        while (member := await reader.next_member()) is not None:
            path = collector.admit(member)
            if path is not None:
                collector.add(path, await reader.read_data(member.size))
    except StopCollect as stop:
        collector.skip(stop.path, stop.reason)
    except ArchiveError as exc:
        collector.skip("", str(exc))
    return collector.result


def printable(path: str) -> str:
    """The path with control characters and undecodable bytes as escapes: for display only."""
    return _UNUSABLE.sub(_escape, path)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        code -= 0xDC00
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
