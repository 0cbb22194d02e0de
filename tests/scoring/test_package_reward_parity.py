"""The same recorded answers, scored by the paper's package's own reward code and by
Sandhive under the package's rules, give the same scores, domain by domain.

The package side runs llm-in-sandbox 0.2.0's `benchmark/<task>/reward.py` (installed by
`make reference-package`) in a process of its own (tests/scoring/package_rewards.py), on
the answer its benchmark runner passes: `cat answer.txt` through its runtime (ANSI colour
codes and carriage returns dropped), stripped. The Sandhive side scores the raw answer
through `scored_answer` (an experiment's `rules: package`) and the scorer a package-folder
run uses for the domain. physics and long_context have no rule to compare (their
reward.py is a placeholder 0.0; both grade with an LLM judge), and instruct_follow's needs
a clone of IFBench.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.domain.scored_answer import scored_answer
from app.scoring.registry import scorer_for
from app.scoring.types import score_answer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_LIB = ROOT / ".package-lib"
SCORERS: dict[str, dict[str, Any]] = {
    "math": {"kind": "math", "package": True},
    "chem": {"kind": "mcq", "package": True},
    "biomed": {"kind": "mcq", "package": True},
    "demo": {"kind": "exact"},
}
"""The scorer of each package task, as docs/experiments.md tells a folder run to use."""

MATH = [
    (r"so the result is $\boxed{\frac{1}{2}}$", "0.5"),
    (r"\boxed{\frac{1}{2}}", "1/2"),
    ("0.5", r"\frac12"),
    (r"\boxed{\dfrac{3}{4}}", "0.75"),
    (r"\boxed{50\%}", "0.5"),
    ("The answer is 42.", "42"),
    ("  \\boxed{42}\n", "42"),
    ("\x1b[32m\\boxed{42}\x1b[0m\r\n", "42"),
    (r"\boxed{41}", "42"),
    ("", "42"),
    (r"\boxed{x=3}", "3"),
    ("3.0", "3"),
    (r"\boxed{1,000}", "1000"),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}"),
    ("1.41421356", r"\sqrt{2}"),
    (r"\boxed{(1,2)}", "(1,2)"),
    (r"\boxed{[0,1)}", "[0,1)"),
    (r"I think 7 but \boxed{8}", "8"),
    (r"\boxed{8} then \boxed{7}", "8"),
    ("answer: 12 apples", "12"),  # Sandhive's own `math` reads 12 here; the package does not
    (r"\boxed{1e3}", "1000"),  # nor this
    (r"\boxed{5 \text{ cm}}", "5"),
    (r"\boxed{a+b}", "b+a"),
    (r"\boxed{30^\circ}", "30"),
    (r"\boxed{\frac{\sqrt{3}}{2", r"\frac{\sqrt{3}}{2}"),  # a box never closed
]
MCQ = [
    ("B", "B"),
    ("  b \n", "B"),
    ("The answer is B", "B"),
    ('{"answer": "C"}', "C"),
    ('{"answer": "C", "why": "not B"}', "C"),
    ("Answer: A. B is wrong", "A"),
    ("the answer is d, not E", "D"),
    (r"\boxed{C} since B fails", "C"),
    ("'answer': 'B'", "B"),  # no "answer": "X" here: the last lone letter
    ("Answer: D", "D"),
    ("ANSWER\uff1ac", "C"),  # a full-width colon
    ("the correct choice is A", "A"),
    (r"\boxed{B}", "B"),
    (r"Final Answer: The final answer is $\boxed{A}$", "A"),
    ("I think (C).", "C"),
    ("C is what I pick", "C"),  # the package takes the pronoun I
    ("C is what I pick", "I"),
    ("It's not A, it's C", "C"),
    ("", "B"),
    ("**B**", "B"),
    ("A and B", "B"),
    ("none", "B"),
    ("K", "K"),
    ("B. Because...", "B"),
    ("So, the best choice is option E", "E"),
]
DEMO = [("Paris", "paris"), ("  paris\n", "Paris"), ("Pari", "Paris"), ("", "x"), (" 42\r\n", "42")]
CASES = (
    [("math", answer, truth) for answer, truth in MATH]
    + [(task, answer, truth) for task in ("chem", "biomed") for answer, truth in MCQ]
    + [("demo", answer, truth) for answer, truth in DEMO]
)


UNTEXTUAL: list[tuple[str, str, Any]] = [
    ("math", r"\boxed{42}", 42),
    ("math", "42", [42, "42"]),
    ("chem", "B", ["B"]),
]
"""Ground truths that are not text: Sandhive's own scorers read them, the package's score 0
(its math reward fails inside its `try`; its letter match raises, and its runner scores 0)."""


def test_a_ground_truth_that_is_not_text_scores_as_the_package_scores_it() -> None:
    for task, answer, truth in UNTEXTUAL:
        found = score_answer(scorer_for(SCORERS[task]), answer, {"ground_truth": truth}).value
        assert found == 0.0, (task, answer, truth)
    cases = [[task, answer, {"ground_truth": truth}] for task, answer, truth in UNTEXTUAL]
    # the math ones: chem's raises, and the package's runner scores it 0
    assert scored_by_the_package(cases[:2]) == [0.0, 0.0]


def package_reads(raw: str) -> str:
    """What the package's runner passes its reward for a sandbox run's answer.txt."""
    return re.sub(r"\x1b\[[0-9;]*m|\r", "", raw).strip()


def scored_by_the_package(cases: list[list[Any]]) -> list[float]:
    """`[task, answer, row]` cases scored by the package's own reward code, in one process."""
    if not (PACKAGE_LIB / "llm_in_sandbox").is_dir():
        pytest.fail(f"the paper's package is not in {PACKAGE_LIB}: run `make reference-package`")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scoring" / "package_rewards.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PACKAGE_LIB), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    scores = json.loads(done.stdout)
    assert len(scores) == len(cases)
    return [float(score) for score in scores]


@pytest.fixture(scope="module")
def package_scores() -> list[float]:
    """Every case as the package scores it."""
    return scored_by_the_package(
        [[task, package_reads(raw), {"ground_truth": truth}] for task, raw, truth in CASES]
    )


@pytest.mark.parametrize("task", sorted(SCORERS))
def test_every_recorded_answer_scores_as_the_package_scores_it(
    task: str, package_scores: list[float]
) -> None:
    scorer = scorer_for(SCORERS[task])
    differ = []
    for (case_task, raw, truth), expected in zip(CASES, package_scores, strict=True):
        if case_task != task:
            continue
        answer = scored_answer("succeeded", "submitted", raw, package=True, sandbox=True)
        found = score_answer(scorer, answer, {"ground_truth": truth}).value
        if found != expected:
            differ.append((raw, truth, found, expected))
    assert differ == [], f"(answer, ground truth, Sandhive, the package) for {task}"


def test_the_cases_tell_the_rules_apart(package_scores: list[float]) -> None:
    """The package's rules matter on these answers: Sandhive's own scorers disagree with the
    package on some (so the test above would catch a package-rule scorer that is not)."""
    own = {"math": scorer_for({"kind": "math"}), "mcq": scorer_for({"kind": "mcq"})}
    disagreements = 0
    for (task, raw, truth), expected in zip(CASES, package_scores, strict=True):
        kind = SCORERS[task]["kind"]
        if kind in own:
            try:
                found = own[kind].score(raw.strip(), {"ground_truth": truth}).value
            except Exception:  # Sandhive's mcq refuses a ground truth outside A to J
                found = None
            disagreements += found != expected
    assert disagreements >= 4
