"""The `llm_judge` scorer: a configured model says CORRECT or INCORRECT, `repeats` times.

Only the pure parts live here (options, the prompt, reading verdicts, aggregating them), so
they are tested without a model; the call itself is the worker's (`app.worker.judge`),
because the scorer is `deferred`: it is slow and must not run in the advancing transaction.
The verdict is the last CORRECT/INCORRECT word of the reply after any `</think>`, as the
reference package's `judge.py` reads it (REFERENCE.md §1.9), so scores match the package's.
But the answer is untrusted text the judge may quote: when the answer itself carries such a
word, a reply quoting it after the verdict would hand the answer its own verdict (issue
#28), so for those answers only the reply's last word counts. The answer the judge sees has
no `</think>` (`final_text`), so a quote cannot cut the reply short either. A reply with no
verdict, or a failed call, makes the whole item a scorer error: a judge that could not judge
is never a 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from app.scoring.types import Score, ScorerError, ground_truths

Aggregate = Literal["majority", "mean"]
AGGREGATES: tuple[Aggregate, ...] = ("majority", "mean")
MAX_REPEATS = 9
MAX_RUBRIC_CHARS = 20_000
_VERDICT_WORD = re.compile(r"\b(INCORRECT|CORRECT)\b", re.IGNORECASE)
_LAST_WORD = re.compile(r"\b(INCORRECT|CORRECT)\Z", re.IGNORECASE)
_AFTER_VERDICT = " \t\r\n*_`.!"
"""What may follow a last-word verdict: markdown emphasis, a full stop. Not a quote mark."""
_THINK_END = "</think>"


@dataclass(frozen=True)
class LlmJudgeScorer:
    """Which model judges (an LLM profile, optionally one of its models), against what."""

    profile: str
    model: str | None = None
    rubric: str | None = None
    repeats: int = 1
    aggregate: Aggregate = "majority"
    temperature: float = 0.7
    """The package's default: repeats only mean something if the judge may vary."""

    kind: ClassVar[str] = "llm_judge"
    deferred: ClassVar[bool] = True

    @property
    def needs_ground_truth(self) -> bool:
        """A rubric can stand on its own; without one, the judge compares to the answer key."""
        return self.rubric is None

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        raise ScorerError("llm_judge is scored by a worker's scoring loop, not in-line")


def judge_messages(
    scorer: LlmJudgeScorer, answer: str, row: Mapping[str, Any]
) -> list[dict[str, str]]:
    """The one user message the judge gets: problem, reference, rubric, candidate answer."""
    parts = [
        "You are grading a candidate's answer to a problem.",
        f"PROBLEM:\n{row.get('problem_statement', '')}",
    ]
    against = "the rubric"
    if row.get("ground_truth") not in (None, "", []):
        parts.append("OFFICIAL ANSWER:\n" + "\n".join(ground_truths(row, scorer.kind)))
        against = "the official answer" + (" and the rubric" if scorer.rubric else "")
    if scorer.rubric:
        parts.append(f"RUBRIC:\n{scorer.rubric}")
    parts.append(f"CANDIDATE ANSWER:\n{final_text(answer)}")
    parts.append(
        f"Decide whether the candidate answer is correct according to {against}. Explain "
        "briefly, then end with one word on its own line: CORRECT or INCORRECT."
    )
    return [{"role": "user", "content": "\n\n".join(parts)}]


def final_text(text: str) -> str:
    """What follows the last `</think>`: a reasoning model's thoughts are not its answer."""
    return text.rsplit(_THINK_END, 1)[-1].strip()


def verdict(reply: str, answer: str | None = None) -> bool | None:
    """True for CORRECT, False for INCORRECT, None for neither: the last such word of the
    reply, or only its last word when the judged `answer` carries a verdict word itself."""
    text = final_text(reply)
    if answer is not None and _VERDICT_WORD.search(final_text(answer)):
        found = _LAST_WORD.search(text.rstrip(_AFTER_VERDICT))
        return None if found is None else found[1].upper() == "CORRECT"
    words = _VERDICT_WORD.findall(text)
    return None if not words else words[-1].upper() == "CORRECT"


def judged(
    scorer: LlmJudgeScorer, exchanges: Sequence[Mapping[str, Any]], answer: str | None = None
) -> Score:
    """The score of `answer` from its exchanges (`{"reply": ...}` each, in order).

    `majority`: 1 when more than half the verdicts are CORRECT, else 0; `mean`: the share
    that are. Raises ScorerError (with the exchanges) when any reply has no verdict.
    """
    verdicts = [verdict(str(exchange.get("reply", "")), answer) for exchange in exchanges]
    detail = {"exchanges": [dict(exchange) for exchange in exchanges], "verdicts": verdicts}
    if not verdicts:
        raise ScorerError("the judge gave no reply", detail)
    missing = [i for i, found in enumerate(verdicts) if found is None]
    if missing:
        raise ScorerError(
            f"the judge's reply {missing[0] + 1} of {len(verdicts)} has no verdict "
            "(CORRECT or INCORRECT)",
            detail,
        )
    correct = sum(1 for found in verdicts if found)
    if scorer.aggregate == "mean":
        value = correct / len(verdicts)
    else:
        value = 1.0 if correct * 2 > len(verdicts) else 0.0
    return Score(value, {**detail, "aggregate": scorer.aggregate, "correct": correct})
