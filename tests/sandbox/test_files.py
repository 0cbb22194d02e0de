"""Tar helpers without Docker: safe names in, hostile archives out, caps while reading."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

from app.sandbox.files import (
    CollectCaps,
    CollectedFile,
    build_tar,
    collect_tar,
    normalize_relpath,
)

CAPS = CollectCaps(max_files=100, max_file_bytes=10_000, max_total_bytes=100_000)


def make_tar(
    members: list[tuple[str, bytes, bytes]], fmt: int = tarfile.PAX_FORMAT, link: str = ""
) -> bytes:
    """(name, type, content) entries, as a container might send them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, content in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(content) if kind == tarfile.REGTYPE else 0
            info.linkname = link
            tar.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def collect(data: bytes, caps: CollectCaps = CAPS, src: str = "/testbed/output"):
    return await collect_tar(reader_of(data), src, caps)


@pytest.mark.parametrize(
    ("raw", "expected"), [("a.txt", "a.txt"), ("./d/e/f.bin", "d/e/f.bin"), ("a/./b", "a/b")]
)
def test_normalize_relpath_accepts(raw: str, expected: str) -> None:
    assert normalize_relpath(raw) == expected


@pytest.mark.parametrize("raw", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/", ".", "a\0b"])
def test_normalize_relpath_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="invalid relative path"):
        normalize_relpath(raw)


def test_build_tar_creates_parent_dirs_and_keeps_bytes() -> None:
    payload = bytes(range(256)) * 3
    data = build_tar([("top.txt", b"hi"), ("deep/er/bin.dat", payload)])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert set(names) == {"top.txt", "deep", "deep/er", "deep/er/bin.dat"}
        assert names["deep"].isdir()
        assert names["deep/er"].isdir()
        assert names["deep/er/bin.dat"].uid == 0
        assert tar.extractfile("deep/er/bin.dat").read() == payload  # type: ignore[union-attr]


def test_build_tar_rejects_unsafe_names() -> None:
    with pytest.raises(ValueError, match="invalid relative path"):
        build_tar([("ok.txt", b""), ("../escape", b"x")])


async def test_collect_keeps_regular_files_relative_to_src() -> None:
    data = make_tar(
        [
            ("output", tarfile.DIRTYPE, b""),
            ("output/a.txt", tarfile.REGTYPE, b"alpha"),
            ("output/sub", tarfile.DIRTYPE, b""),
            ("output/sub/b.bin", tarfile.REGTYPE, b"\x00\xff" * 700),
            ("output/empty", tarfile.REGTYPE, b""),
        ]
    )
    got = await collect(data)
    assert got.files == [
        CollectedFile("a.txt", b"alpha"),
        CollectedFile("sub/b.bin", b"\x00\xff" * 700),
        CollectedFile("empty", b""),
    ]
    assert got.skipped == []


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (tarfile.SYMTYPE, "symlink"),
        (tarfile.LNKTYPE, "hardlink"),
        (tarfile.CHRTYPE, "device"),
        (tarfile.BLKTYPE, "device"),
        (tarfile.FIFOTYPE, "fifo"),
    ],
)
async def test_collect_skips_non_regular_members(kind: bytes, reason: str) -> None:
    data = make_tar(
        [("output/odd", kind, b""), ("output/ok", tarfile.REGTYPE, b"ok")], link="/etc/passwd"
    )
    got = await collect(data)
    assert got.files == [CollectedFile("ok", b"ok")]
    assert got.skipped == [("odd", reason)]


@pytest.mark.parametrize("name", ["../evil", "/etc/cron.d/evil", "output/../../evil", "other/x"])
async def test_collect_skips_names_that_escape(name: str) -> None:
    data = make_tar([(name, tarfile.REGTYPE, b"pwn"), ("output/ok", tarfile.REGTYPE, b"ok")])
    got = await collect(data)
    assert got.files == [CollectedFile("ok", b"ok")]
    assert got.skipped == [(name, "outside source directory")]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
async def test_collect_reads_long_names(fmt: int) -> None:
    long_name = "output/" + "d" * 90 + "/" + "f" * 50 + ".txt"
    got = await collect(make_tar([(long_name, tarfile.REGTYPE, b"long")], fmt=fmt))
    assert got.files == [CollectedFile(long_name.removeprefix("output/"), b"long")]


async def test_collect_pax_names_are_utf8() -> None:
    got = await collect(make_tar([("output/résumé ✓.txt", tarfile.REGTYPE, b"x")]))
    assert got.files == [CollectedFile("résumé ✓.txt", b"x")]


async def test_collect_skips_too_large_files_and_goes_on() -> None:
    caps = CollectCaps(max_files=10, max_file_bytes=100, max_total_bytes=1000)
    data = make_tar(
        [("output/big", tarfile.REGTYPE, b"b" * 101), ("output/small", tarfile.REGTYPE, b"s" * 100)]
    )
    got = await collect(data, caps)
    assert got.files == [CollectedFile("small", b"s" * 100)]
    assert got.skipped == [("big", "too large")]


async def test_collect_stops_at_max_files() -> None:
    caps = CollectCaps(max_files=2, max_file_bytes=100, max_total_bytes=1000)
    members = [(f"output/f{i}", tarfile.REGTYPE, b"x") for i in range(5)]
    got = await collect(make_tar(members), caps)
    assert [f.path for f in got.files] == ["f0", "f1"]
    assert got.skipped == [("f2", "file limit reached")]


async def test_collect_stops_at_max_total_bytes() -> None:
    caps = CollectCaps(max_files=10, max_file_bytes=100, max_total_bytes=150)
    members = [(f"output/f{i}", tarfile.REGTYPE, b"x" * 60) for i in range(4)]
    got = await collect(make_tar(members), caps)
    assert [f.path for f in got.files] == ["f0", "f1"]
    assert got.skipped == [("f2", "total size limit reached")]


async def test_collect_stops_at_the_archive_budget() -> None:
    caps = CollectCaps(
        max_files=10, max_file_bytes=100, max_total_bytes=1000, max_archive_bytes=8192
    )
    members = [
        ("output/a", tarfile.REGTYPE, b"a"),
        ("output/huge", tarfile.REGTYPE, b"h" * 20_000),
        ("output/z", tarfile.REGTYPE, b"z"),
    ]
    got = await collect(make_tar(members), caps)
    assert got.files == [CollectedFile("a", b"a")]
    assert ("huge", "too large") in got.skipped
    assert ("", "archive read limit reached") in got.skipped


async def test_collect_reports_a_truncated_archive() -> None:
    data = make_tar(
        [("output/a", tarfile.REGTYPE, b"a"), ("output/b", tarfile.REGTYPE, b"b" * 5000)]
    )
    got = await collect(data[:2048])
    assert got.files == [CollectedFile("a", b"a")]
    assert got.skipped == [("", "truncated archive")]


async def test_collect_refuses_a_corrupt_header() -> None:
    data = bytearray(make_tar([("output/a", tarfile.REGTYPE, b"a")]))
    data[0] ^= 0x20  # "output" becomes "Output": the checksum no longer matches
    got = await collect(bytes(data))
    assert got.files == []
    assert got.skipped == [("", "corrupt tar header (bad checksum)")]


async def test_collect_single_file_source() -> None:
    got = await collect(make_tar([("answer.txt", tarfile.REGTYPE, b"42")]), src="/out/answer.txt")
    assert got.files == [CollectedFile("answer.txt", b"42")]


async def test_collect_lists_a_bounded_number_of_skipped_entries() -> None:
    members = [(f"output/l{i}", tarfile.SYMTYPE, b"") for i in range(1100)]
    got = await collect(make_tar(members, link="/etc/passwd"))
    assert len(got.skipped) == 1001
    assert got.skipped[-1] == ("", "more entries skipped")


async def test_collect_skips_names_too_long_to_store() -> None:
    long_name = "output/" + "/".join(["d" * 200] * 6) + "/f.txt"
    data = make_tar([(long_name, tarfile.REGTYPE, b"x"), ("output/ok", tarfile.REGTYPE, b"ok")])
    got = await collect(data)
    assert got.files == [CollectedFile("ok", b"ok")]
    assert [reason for _, reason in got.skipped] == ["unusable file name"]


async def test_collect_skips_undecodable_names() -> None:
    # GNU format keeps raw bytes: a non-UTF-8 name decodes with a replacement character.
    raw = make_tar([("output/x", tarfile.REGTYPE, b"a")], fmt=tarfile.GNU_FORMAT)
    data = raw.replace(b"output/x", b"output/\xff", 1)
    data = data[:148] + b"        " + data[156:]  # recompute the header checksum below
    checksum = sum(data[:512])
    data = data[:148] + f"{checksum:06o}\0 ".encode() + data[156:]
    got = await collect(data)
    assert got.files == []
    assert [reason for _, reason in got.skipped] == ["unusable file name"]


async def test_collect_keeps_only_the_first_of_repeated_members() -> None:
    data = make_tar(
        [("output/a.txt", tarfile.REGTYPE, b"first"), ("output/a.txt", tarfile.REGTYPE, b"second")]
    )
    got = await collect(data)
    assert got.files == [CollectedFile("a.txt", b"first")]
    assert got.skipped == [("a.txt", "duplicate entry")]
