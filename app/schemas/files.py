"""What `/v1/tasks/{id}/files` answers (docs/files.md): a running sandbox's directory
listing and the result of a write.

A leaf like `app.schemas.tasks`: the worker validates what the sandbox printed with these
models before it answers (the sandbox is hostile), the API serves them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schemas.tasks import WireModel

MAX_NAME_CHARS = 4096


class FileEntry(WireModel):
    """One directory entry, as the sandbox sees it (links are not followed)."""

    name: str = Field(max_length=MAX_NAME_CHARS, examples=["answer.txt"])
    """The entry's name (no directory part)."""
    type: Literal["file", "dir", "symlink", "other"]
    """`other`: a fifo, socket or device."""
    size: int = Field(ge=0, examples=[42])
    """Bytes (of the link itself for a symlink)."""
    mtime: float = Field(examples=[1796135753.6])
    """Last modification, seconds since the epoch (the sandbox's clock)."""


class FileList(WireModel):
    """A directory of a running task's sandbox."""

    path: str = Field(max_length=MAX_NAME_CHARS, examples=["/testbed/output"])
    """The directory's real path in the sandbox (links resolved)."""
    entries: list[FileEntry]
    """By name; at most `task_files_max_entries`."""
    truncated: bool = False
    """True when the directory has more entries than were listed."""
    unlisted: int = Field(default=0, ge=0)
    """Entries left out because their names are not printable UTF-8."""


class FileWritten(WireModel):
    """A file written into a running task's sandbox."""

    path: str = Field(max_length=MAX_NAME_CHARS, examples=["/testbed/input/data.csv"])
    """Its real path in the sandbox (links resolved)."""
    size: int = Field(ge=0, examples=[1024])
    """Bytes written."""
