"""Bounded output capture: small output is kept whole, a flood keeps its head and tail."""

from __future__ import annotations

from app.sandbox.capture import OutputCapture


def test_small_output_is_kept_whole() -> None:
    capture = OutputCapture(100)
    for chunk in (b"abc", b"", b"def" * 10):
        capture.add(chunk)
    assert capture.value() == b"abc" + b"def" * 10
    assert capture.dropped == 0


def test_exactly_at_cap_drops_nothing() -> None:
    capture = OutputCapture(10)
    capture.add(b"0123456789")
    assert capture.value() == b"0123456789"


def test_flood_keeps_head_and_tail_and_counts_the_rest() -> None:
    capture = OutputCapture(1000)
    lines = [f"line {i}\n".encode() for i in range(100_000)]
    for line in lines:
        capture.add(line)
    whole = b"".join(lines)
    value = capture.value()
    assert value.startswith(whole[:500])
    assert value.endswith(whole[-500:])
    assert capture.dropped == len(whole) - 1000
    assert f"[... {capture.dropped} bytes of output dropped ...]".encode() in value
    assert len(value) < 1100


def test_one_huge_chunk_is_split_between_head_and_tail() -> None:
    capture = OutputCapture(10)
    capture.add(b"H" * 5 + b"m" * 1000 + b"T" * 5)
    assert capture.value() == b"HHHHH\n[... 1000 bytes of output dropped ...]\nTTTTT"
