"""A tenant's build context: checked once by the API, repacked with its Dockerfile by a worker.

The caller sends a tar archive (plain or gzip). Only regular files, directories and links
are taken: a device node or a FIFO has no business in an image a sandbox runs, and the
daemon would make them as root. The unpacked size is bounded too, so a small gzip cannot
become a large disk. A pure module (stdlib only).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zlib

DOCKERFILE = ".sandhive.Dockerfile"
"""The Dockerfile's name in the context sent to Docker (not to clash with the caller's)."""
GZIP_MAGIC = b"\x1f\x8b"
UNPACKED_FACTOR = 8
"""The context may unpack to this many times the request's cap."""


class ContextRefused(ValueError):
    """The archive cannot be a build context: the message says why."""


def check(raw: bytes, max_unpacked: int) -> str:
    """A usable context's digest, or ContextRefused. The digest is of what a build can see
    (each entry's path, kind, mode, link target and content, in path order), not of the
    archive's bytes: the same files packed again, by another tool or at another time, give
    the same digest."""
    plain = _unpacked(raw, max_unpacked)
    size = 0
    entries: list[tuple[str, str, int, str, str]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
            for member in tar:
                if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                    raise ContextRefused(
                        f"{member.name}: only files, directories and links (not a device,"
                        " FIFO or socket)"
                    )
                if _outside(member.name) or (member.islnk() and _outside(member.linkname)):
                    raise ContextRefused(f"{member.name}: a path outside the context")
                size += member.size
                if size > max_unpacked:
                    raise ContextRefused(f"it unpacks to more than {max_unpacked} bytes")
                entries.append(_entry(tar, member))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ContextRefused(f"not a tar archive (plain or gzip): {exc}") from exc
    return hashlib.sha256(json.dumps(sorted(entries)).encode()).hexdigest()


def _outside(path: str) -> bool:
    return path.startswith("/") or ".." in path.split("/")


def _entry(tar: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[str, str, int, str, str]:
    """What a build sees of one entry: path, kind, mode, link target, content digest."""
    content = ""
    if member.isfile():
        data = tar.extractfile(member)
        content = hashlib.sha256(data.read() if data is not None else b"").hexdigest()
    path = member.name.removeprefix("./").rstrip("/") or "."
    return path, member.type.decode(), member.mode & 0o7777, member.linkname, content


def _unpacked(raw: bytes, max_unpacked: int) -> bytes:
    """The tar itself: gunzipped when gzip, never past `max_unpacked` (a small gzip can
    stand for a huge file)."""
    if raw[:2] != GZIP_MAGIC:
        return raw
    inflate = zlib.decompressobj(wbits=31)
    try:
        plain = inflate.decompress(raw, max_unpacked + 1)
    except zlib.error as exc:
        raise ContextRefused(f"not a tar archive (plain or gzip): {exc}") from exc
    if len(plain) > max_unpacked or inflate.unconsumed_tail:
        raise ContextRefused(f"it unpacks to more than {max_unpacked} bytes")
    if not inflate.eof or inflate.unused_data:
        # A second gzip member (or trailing bytes) would be read by the builder unchecked.
        raise ContextRefused("not a tar archive (plain or gzip): one gzip member, whole")
    return plain


def with_dockerfile(raw: bytes | None, dockerfile: str) -> bytes:
    """A gzipped context: the caller's entries (checked already) and the Dockerfile."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as packed:
        if raw:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
                for member in tar:
                    if member.name.removeprefix("./") == DOCKERFILE:
                        continue
                    data = tar.extractfile(member) if member.isfile() else None
                    packed.addfile(member, data)
        content = dockerfile.encode()
        info = tarfile.TarInfo(DOCKERFILE)
        info.size, info.mode = len(content), 0o644
        packed.addfile(info, io.BytesIO(content))
    return gzip.compress(out.getvalue(), compresslevel=1)
