"""The paper's package's own rules for math and multiple choice answers, for experiments
whose numbers must equal its `llm-in-sandbox benchmark` runs to the digit:
`{"kind": "math", "package": true}` and `{"kind": "mcq", "package": true}`.

Sandhive's `math` and `mcq` read more answers the way a person would (an "Answer: 12
apples" phrase, a numeric tolerance, the pronoun "I" never taken for choice I). These
follow llm-in-sandbox 0.2.0's `benchmark/math/reward.py` and `benchmark/{chem,biomed}/
reward.py` instead, rule for rule, with the same library (math-verify) where it uses one;
tests/scoring/test_package_reward_parity.py scores the same answers through the package's
own code and through these. Like the package, an answer they cannot read scores 0, and so
does a ground truth that is not text; only a missing one is an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from app.scoring.types import Score, ground_truths

_BOX = "\\boxed{"
_JSON_ANSWER = re.compile(r'"answer"\s*:\s*"([A-Z])"', re.IGNORECASE)
_ANSWER_COLON = re.compile(r"answer\s*[:\uff1a]\s*([A-Z])\b", re.IGNORECASE)  # or full-width
_ANSWER_IS = re.compile(r"(?:answer|choice)\s+is\s+([A-Z])\b", re.IGNORECASE)
_LONE_LETTER = re.compile(r"\b([A-Z])\b")


def boxed_or_whole(text: str) -> str:
    """The last `\\boxed{...}`'s content (nested braces counted), else the whole text;
    stripped either way, and the whole text when the last box never closes."""
    start = text.rfind(_BOX)
    if start == -1:
        return text.strip()
    depth, i = 1, start + len(_BOX)
    while i < len(text) and depth > 0:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start + len(_BOX) : i - 1].strip() if depth == 0 else text.strip()


@dataclass(frozen=True)
class PackageMathScorer:
    """math-verify's `math_metric` on the boxed ground truth and the answer's last box (or
    the whole answer) boxed again; 0 on any failure of the library, as the package."""

    kind: ClassVar[str] = "math"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        if (untextual := _not_text(row)) is not None:
            return untextual
        references = ground_truths(row, self.kind)
        extracted = boxed_or_whole(answer or "")
        for reference in references:
            if _math_verified(reference, extracted):
                return Score(1.0, {"extracted": extracted, "rule": "package", "match": reference})
        return Score(0.0, {"extracted": extracted, "rule": "package", "match": None})


def _math_verified(reference: str, extracted: str) -> bool:
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    try:
        verify = math_metric(
            gold_extraction_target=(LatexExtractionConfig(),),
            pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
        )
        value, _ = verify([f"{_BOX}{reference}}}"], [f"{_BOX}{extracted}}}"])
    except Exception:  # the package scores whatever the library raises as 0
        return False
    return float(value) == 1.0


@dataclass(frozen=True)
class PackageMcqScorer:
    """The letter the package's extractor finds (the answer itself, then `"answer": "X"`,
    `Answer: X`, "answer/choice is X", a box, the last lone capital letter, the first
    character), compared with the ground truth case-insensitively."""

    kind: ClassVar[str] = "mcq"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        if (untextual := _not_text(row)) is not None:
            return untextual
        text = answer or ""
        expected = [reference.strip().upper() for reference in ground_truths(row, self.kind)]
        chosen = text.strip().upper()
        if chosen not in expected:
            chosen = package_choice(text)
        detail = {"extracted": chosen, "rule": "package", "ground_truth": expected[0]}
        return Score(1.0 if chosen in expected else 0.0, detail)


def _not_text(row: Mapping[str, Any]) -> Score | None:
    """The package's score of a ground truth that is not text (a number, a list): its math
    reward fails inside its `try` and its letter match outside, in the runner's; 0 both
    ways. Sandhive's own scorers read numbers and lists; these keep the package's number."""
    value = row.get("ground_truth")
    if value is None or isinstance(value, str):
        return None  # None: the usual "needs a ground_truth" error
    reason = f"the package's reward.py scores a ground truth that is not text ({value!r}) 0"
    return Score(0.0, {"rule": "package", "reason": reason})


def package_choice(text: str) -> str:
    """The package's `extract_multiple_choice_answer`: a letter, or "" for none."""
    if not text:
        return ""
    for pattern in (_JSON_ANSWER, _ANSWER_COLON, _ANSWER_IS):
        if found := pattern.search(text):
            return found.group(1).upper()
    boxed = boxed_or_whole(text)
    if boxed != text.strip() and boxed and boxed[0].upper().isalpha():
        return boxed[0].upper()
    if letters := _LONE_LETTER.findall(text.upper()):
        return str(letters[-1])
    stripped = text.strip()
    return stripped[0].upper() if stripped and stripped[0].upper().isalpha() else ""
