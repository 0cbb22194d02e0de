"""Shrinking tool output before the model sees it: the reference's cuts, plus a byte cap.

Pure string functions used by `app.agent.bash` and `app.agent.editor`. The line
cut, the ANSI stripping and the editor's 10,000-character clip reproduce the
reference package exactly (REFERENCE.md §1.4); the byte cap is Sandhive's own.
"""

from __future__ import annotations

import re

KEEP_LINES = 40
"""Lines kept at each end when a stream has more than twice as many."""
DIVIDER = "-" * 50
LINES_MARKER = "<Observation truncated in middle for saving context>"

CLIP_CHARS = 10_000
CLIP_NOTICE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry this tool after you have searched inside the file with `grep -n` in order "
    "to find the line numbers of what you are looking for.</NOTE>"
)

STREAM_BYTE_CAP = 64 * 2**10
"""Standard profile: most bytes of one stream that reach the model, after the line cut."""

_ANSI_OR_CR = re.compile(r"\x1b\[[0-9;]*m|\r")


def clean(data: bytes) -> str:
    """Decode like the package: UTF-8 with replacement, colour codes and carriage returns gone."""
    return _ANSI_OR_CR.sub("", data.decode("utf-8", errors="replace"))


def truncate_lines(text: str, keep: int = KEEP_LINES) -> str:
    """Keep the first and last `keep` lines of a long stream, with the package's divider."""
    if not text:
        return ""
    lines = text.splitlines()
    if len(lines) <= 2 * keep:
        return text
    top = "\n".join(lines[:keep])
    bottom = "\n".join(lines[-keep:])
    return f"{top}\n{DIVIDER}\n{LINES_MARKER}\n{DIVIDER}\n{bottom}"


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """The editor's cut: the first `limit` characters, then the notice."""
    if len(text) <= limit:
        return text
    return text[:limit] + CLIP_NOTICE


def cap_bytes(text: str, cap: int = STREAM_BYTE_CAP) -> str:
    """Keep the head and tail halves of a text longer than `cap` UTF-8 bytes, with a marker."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= cap:
        return text
    half = cap // 2
    omitted = len(raw) - 2 * half
    head = raw[:half].decode("utf-8", errors="ignore")
    tail = raw[-half:].decode("utf-8", errors="ignore")
    marker = f"<Observation truncated in middle: {omitted} bytes omitted (limit {cap} bytes)>"
    return f"{head}\n{DIVIDER}\n{marker}\n{DIVIDER}\n{tail}"
