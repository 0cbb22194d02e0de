"""The body of `POST /v1/images/builds`: the Dockerfile's text and the build context packed.

A context directory becomes a gzipped tar made in memory the same way each time (entries
sorted, owners root, gzip without a timestamp), so packing an unchanged directory again
sends the same bytes and the server answers the image it already built. Blocking file I/O:
the async client runs it in a thread.
"""

from __future__ import annotations

import base64
import gzip
import io
import os
import stat
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Dockerfile = str | os.PathLike[str]
"""The Dockerfile's text, or a path to read it from."""
Context = os.PathLike[str] | str | bytes | None
"""A directory (or a tar archive file) to send, a tar archive's bytes, or nothing."""


def build_body(
    name: str,
    dockerfile: Dockerfile,
    context: Context,
    build_args: Mapping[str, str] | None,
    description: str,
) -> dict[str, Any]:
    """The JSON body: the context as base64 of a tar archive (None: the Dockerfile alone)."""
    body: dict[str, Any] = {
        "name": name,
        "dockerfile": dockerfile_text(dockerfile),
        "build_args": dict(build_args or {}),
        "description": description,
    }
    archive = context_archive(context)
    if archive is not None:
        body["context"] = base64.b64encode(archive).decode("ascii")
    return body


def dockerfile_text(dockerfile: Dockerfile) -> str:
    """A str is the Dockerfile itself; a path is read (UTF-8)."""
    if isinstance(dockerfile, str):
        return dockerfile
    return Path(dockerfile).read_text(encoding="utf-8")


def context_archive(context: Context) -> bytes | None:
    """Bytes as they are (a tar archive, gzip or plain); a directory packed; a file read."""
    if context is None or isinstance(context, bytes):
        return context
    path = Path(context)
    if path.is_dir():
        return pack_directory(path)
    if path.is_file():
        return path.read_bytes()
    raise FileNotFoundError(f"build context {path}: no such directory (or tar archive)")


def pack_directory(directory: Path) -> bytes:
    """`directory`'s tree (`walk`) as a gzipped tar, names relative to it; symlinks stay links
    (never followed, so nothing outside it is sent), modes and mtimes kept, owners root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, name in walk(directory):
            archive.add(str(path), arcname=name, recursive=False, filter=as_root)
    return gzip.compress(buffer.getvalue(), mtime=0)


def walk(directory: Path) -> list[tuple[Path, str]]:
    """Every file, directory and symlink below `directory` (not itself) with its POSIX name
    relative to it, sorted; a symlink to a directory is an entry, not descended into. Other
    kinds (a FIFO, a socket, a device) are left out: the server takes none in a context."""
    found: list[tuple[Path, str]] = []
    for top, dirs, files in os.walk(directory):
        here = Path(top)
        relative = here.relative_to(directory)
        for name in [*dirs, *files]:
            mode = (here / name).lstat().st_mode
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
                found.append((here / name, (relative / name).as_posix()))
    return sorted(found, key=lambda entry: entry[1])


def as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member
