"""Archives an agent can shape, read without Docker: PAX and GNU sizes past 8 GiB, content
that looks like tar headers, sparse members, control characters in names.

Docker's Go archive/tar announces a file of 8 GiB or more only in a PAX `size` record,
with 0 in the classic field (as `tarfile` does, so its headers stand in for Docker's);
an 8 GiB sparse file costs the agent nothing, so sizes like that are streamed here
lazily, never held in memory.
"""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

from app.sandbox.files import CollectCaps, CollectedFile, collect_tar

CAPS = CollectCaps(max_files=100, max_file_bytes=10_000, max_total_bytes=100_000)
HUGE = 9 * 2**30
ZEROS = bytes(2**20)


class LazySource:
    """A ByteSource over pieces of bytes and runs of zeros (ints), built as it is read."""

    def __init__(self, *pieces: bytes | int) -> None:
        self._pieces = list(pieces)
        self.served = 0

    async def read(self, n: int) -> bytes:
        while self._pieces and self._pieces[0] in (b"", 0):
            self._pieces.pop(0)
        if not self._pieces:
            return b""
        head = self._pieces[0]
        if isinstance(head, int):
            chunk = ZEROS[: min(n, head, len(ZEROS))]
            self._pieces[0] = head - len(chunk)
        else:
            chunk, self._pieces[0] = head[:n], head[n:]
        self.served += len(chunk)
        return chunk

    async def readexactly(self, n: int) -> bytes:
        parts = []
        while n and (chunk := await self.read(n)):
            parts.append(chunk)
            n -= len(chunk)
        if n:
            raise asyncio.IncompleteReadError(b"".join(parts), len(b"".join(parts)) + n)
        return b"".join(parts)


def header(name: str, size: int, fmt: int = tarfile.PAX_FORMAT, kind: bytes = b"0") -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape")


def member(name: str, content: bytes, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return header(name, len(content), fmt) + content + bytes(-len(content) % 512)


def make_tar(files: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, content in files:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


END = bytes(1024)
FORGED = member("output/evil.txt", b"made up by the agent") + END
"""What a hostile file starts with: a whole tar of a file that is not in the sandbox."""


def huge_member(size: int, fmt: int = tarfile.PAX_FORMAT) -> list[bytes | int]:
    """A member of `size` bytes whose content is a forged archive, then zeros."""
    return [header("output/huge", size, fmt), FORGED, size - len(FORGED), -size % 512]


async def test_a_pax_size_past_8_gib_is_followed_to_the_next_member() -> None:
    caps = CollectCaps(
        max_files=10, max_file_bytes=100, max_total_bytes=1000, max_archive_bytes=HUGE + 2**20
    )
    source = LazySource(
        member("output/a.txt", b"before"),
        *huge_member(8 * 2**30 + 3),
        member("output/zz.txt", b"after"),
        END,
    )
    got = await collect_tar(source, "/testbed/output", caps)
    assert got.files == [CollectedFile("a.txt", b"before"), CollectedFile("zz.txt", b"after")]
    assert got.skipped == [("huge", "too large")]
    assert source.served > 8 * 2**30, "its data was read (and dropped) to reach the next member"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
async def test_a_member_past_the_archive_budget_ends_the_read_at_once(fmt: int) -> None:
    source = LazySource(
        member("output/a.txt", b"before", fmt),
        *huge_member(HUGE, fmt),
        member("output/zz.txt", b"after", fmt),
        END,
    )
    got = await collect_tar(source, "/testbed/output", CAPS)
    assert got.files == [CollectedFile("a.txt", b"before")]
    assert got.skipped == [("huge", "too large"), ("", "archive read limit reached")]
    assert source.served <= 2**17, "nothing of the 9 GiB was read just to be thrown away"


async def test_a_malformed_pax_size_is_refused_not_read_as_zero() -> None:
    pax = b"16 size=12x456\n"
    x_header = header("././@PaxHeader", len(pax), tarfile.USTAR_FORMAT, kind=b"x")
    classic = header("output/huge", 0, tarfile.USTAR_FORMAT)
    data = x_header + pax + bytes(512 - len(pax)) + classic + FORGED
    got = await collect_tar(LazySource(data), "/testbed/output", CAPS)
    assert got.files == []
    assert got.skipped == [("", "corrupt pax header (size)")]


async def test_data_after_the_end_marker_is_reported() -> None:
    data = make_tar([("output/a.txt", b"a")])
    got = await collect_tar(LazySource(data, member("output/b.txt", b"b")), "/x/output", CAPS)
    assert got.files == [CollectedFile("a.txt", b"a")]
    assert got.skipped == [("", "data after the end-of-archive marker")]


async def test_a_global_header_that_renames_members_is_refused() -> None:
    glob = tarfile.TarInfo.create_pax_global_header({"path": "output/evil.txt"})
    data = glob + make_tar([("output/a.txt", b"a")])
    got = await collect_tar(LazySource(data), "/testbed/output", CAPS)
    assert got.files == []
    assert got.skipped == [("", "unsupported global pax header")]


def gnu_sparse_header(name: str, stored: int, real: int) -> bytes:
    """An old GNU sparse member ('S'): one data chunk at offset 0, real size in the header."""
    block = bytearray(header(name, stored, tarfile.GNU_FORMAT, kind=b"S"))
    block[386:398] = b"%011o\0" % 0  # sparse[0].offset
    block[398:410] = b"%011o\0" % stored  # sparse[0].numbytes
    block[483:495] = b"%011o\0" % real  # realsize
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def pax_sparse_header(name: str, stored: int) -> bytes:
    """A GNU sparse 1.0 member: PAX records, a regular header whose data starts with a map."""
    records = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(HUGE),
    }
    info = tarfile.TarInfo("output/GNUSparseFile.0/sparse")
    info.size, info.pax_headers = stored, records
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


@pytest.mark.parametrize("style", ["gnu", "pax"])
async def test_a_sparse_member_is_skipped_and_ends_the_read(style: str) -> None:
    content = b"1\n0\n4\n" + bytes(506) + b"data"  # the PAX 1.0 map, then the data
    if style == "gnu":
        sparse = gnu_sparse_header("output/sparse", len(content), HUGE)
    else:
        sparse = pax_sparse_header("output/sparse", len(content))
    data = (
        member("output/a.txt", b"a")
        + sparse
        + content
        + bytes(-len(content) % 512)
        + member("output/z.txt", b"z")
        + END
    )
    got = await collect_tar(LazySource(data), "/testbed/output", CAPS)
    assert got.files == [CollectedFile("a.txt", b"a")]
    assert got.skipped == [
        ("sparse", "sparse file"),
        ("", "sparse file in the archive: the rest was not read"),
    ]


CONTROL_NAMES = [
    ("new\nline", "new\\x0aline"),
    ("cr\r\nlf", "cr\\x0d\\x0alf"),
    ("tab\tname", "tab\\x09name"),
    ("esc\x1b[31m", "esc\\x1b[31m"),
    ("del\x7f", "del\\x7f"),
    ("nel\x85", "nel\\x85"),
    ("csi\x9b", "csi\\x9b"),
    ("dir\n/inside.txt", "dir\\x0a/inside.txt"),
]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
async def test_names_with_control_characters_are_skipped_as_unusable(fmt: int) -> None:
    files = [(f"output/{name}", b"x") for name, _ in CONTROL_NAMES] + [("output/ok.txt", b"ok")]
    got = await collect_tar(LazySource(make_tar(files, fmt)), "/testbed/output", CAPS)
    assert got.files == [CollectedFile("ok.txt", b"ok")]
    assert got.skipped == [(shown, "unusable file name") for _, shown in CONTROL_NAMES]


async def test_undecodable_bytes_in_a_name_are_shown_as_escapes() -> None:
    raw = bytearray(member("output/ab", b"a", tarfile.GNU_FORMAT))
    raw[7:9] = b"\xff\xfe"  # GNU format keeps raw bytes: "output/\xff\xfe", not UTF-8
    raw[148:156] = b"        "
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    got = await collect_tar(LazySource(bytes(raw), END), "/testbed/output", CAPS)
    assert got.files == []
    assert got.skipped == [("\\xff\\xfe", "unusable file name")]
