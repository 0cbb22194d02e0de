"""A Server-Sent Events reader: lines in, (id, event, data) frames out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    id: str | None
    event: str | None
    data: str


class FrameReader:
    """Accumulates one frame's fields until its blank line; comments (keepalives) are skipped."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        if line == "":
            frame = Frame(self._id, self._event, "\n".join(self._data)) if self._data else None
            self._id, self._event, self._data = None, None, []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        return None


def frames(lines: Iterator[str]) -> Iterator[Frame]:
    reader = FrameReader()
    for line in lines:
        if (frame := reader.feed(line)) is not None:
            yield frame


async def aframes(lines: AsyncIterator[str]) -> AsyncIterator[Frame]:
    reader = FrameReader()
    async for line in lines:
        if (frame := reader.feed(line)) is not None:
            yield frame
