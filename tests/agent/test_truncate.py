"""The pure output cuts: the reference's line truncation and editor clip, and the byte cap."""

from __future__ import annotations

from app.agent.editor import echo_bytes, numbered
from app.agent.truncate import CLIP_NOTICE, cap_bytes, clean, clip, truncate_lines

DIVIDER = "-" * 50
MARKER = "<Observation truncated in middle for saving context>"


def lines(a: int, b: int) -> list[str]:
    return [f"l{i}" for i in range(a, b + 1)]


def test_eighty_lines_pass_untouched_eighty_one_are_cut_40_plus_40() -> None:
    eighty = "\n".join(lines(1, 80)) + "\n"
    assert truncate_lines(eighty) == eighty
    cut = truncate_lines("\n".join(lines(1, 81)) + "\n")
    top, bottom = "\n".join(lines(1, 40)), "\n".join(lines(42, 81))
    assert cut == f"{top}\n{DIVIDER}\n{MARKER}\n{DIVIDER}\n{bottom}"  # final newline dropped


def test_truncation_counts_lines_like_splitlines() -> None:
    assert truncate_lines("") == ""
    # The package uses str.splitlines(): \r\n and form feeds end lines too.
    for separator in ("\r\n", "\x0c"):
        cut = truncate_lines(separator.join(lines(1, 81)))
        assert cut.split("\n")[39:44] == ["l40", DIVIDER, MARKER, DIVIDER, "l42"]


def test_clean_decodes_with_replacement_and_strips_colour_and_cr() -> None:
    assert clean(b"\x1b[1;31mred\x1b[0m\r\n\xff") == "red\n\ufffd"


def test_clip_cuts_at_ten_thousand_characters_then_adds_the_notice() -> None:
    assert clip("x" * 10_000) == "x" * 10_000
    assert clip("x" * 10_001) == "x" * 10_000 + CLIP_NOTICE
    assert CLIP_NOTICE.startswith("<response clipped><NOTE>")
    assert "grep -n" in CLIP_NOTICE


def test_cap_bytes_keeps_head_and_tail_and_respects_utf8() -> None:
    assert cap_bytes("short", cap=10) == "short"
    capped = cap_bytes("é" * 100, cap=21)  # 200 bytes, halves of 10 bytes = 5 characters
    head, divider, marker, divider2, tail = capped.split("\n")
    assert head == tail == "é" * 5
    assert divider == divider2 == DIVIDER
    assert marker == "<Observation truncated in middle: 180 bytes omitted (limit 21 bytes)>"


def test_cat_n_numbering_is_six_wide_and_tab_separated() -> None:
    assert numbered(["a", "", "c"], 9) == "     9\ta\n    10\t\n    11\tc"
    assert numbered(["x"], 123456) == "123456\tx"


def test_echo_adds_a_newline_and_eats_a_lone_option_like_bash() -> None:
    assert echo_bytes("text") == b"text\n"
    assert echo_bytes("") == b"\n"
    assert echo_bytes("-n") == b""
    assert echo_bytes("-e") == b"\n"
    assert echo_bytes("-n x") == b"-n x\n"
