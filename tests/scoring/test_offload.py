"""Built-in scorers in a pool of processes: a slow answer is a scorer error after the
deadline, its process killed, and the event loop runs the whole time.

The answer is a tenant's `regex` backtracking catastrophically on a model's answer
(`^(a|aa)+$` against 40 `a`s and a `!`: about a minute of CPU), the kind of answer
that used to stall a worker past its lease.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from app.scoring import offload
from app.scoring.registry import scorer_for
from app.scoring.types import ScorerError


@dataclass(frozen=True)
class Pool:
    scoring_processes: int
    scoring_timeout_s: float


BACKTRACKS = scorer_for({"kind": "regex", "pattern": "^(a|aa)+$"})
SLOW = "a" * 40 + "!"


async def ticks_during(work: asyncio.Future[object] | asyncio.Task[object]) -> int:
    """How many 20 ms sleeps this loop completed while `work` ran."""
    count = 0
    while not work.done():
        await asyncio.sleep(0.02)
        count += 1
    return count


async def test_a_slow_answer_is_a_scorer_error_and_the_loop_runs_meanwhile() -> None:
    work = asyncio.ensure_future(offload.score_off_loop(BACKTRACKS, SLOW, {}, Pool(1, 2.0)))
    started = time.monotonic()
    ticks = await ticks_during(work)
    with pytest.raises(ScorerError, match=r"took longer than 2 s") as raised:
        await work
    assert raised.value.detail == {"timeout_s": 2.0}
    assert time.monotonic() - started < 30, "killed at its deadline, not run to its end"
    assert ticks >= 20, f"the loop was stalled: {ticks} ticks in 2 s"
    # The pool replaced the killed process: the next answer is scored as usual.
    fine = await offload.score_off_loop(BACKTRACKS, "aaaa", {}, Pool(1, 5.0))
    assert fine.value == 1.0


async def test_many_answers_at_once_share_the_pool_and_keep_their_own_verdicts() -> None:
    answers = ["aa", "ab", SLOW, "aaa", SLOW, "b"]
    found = await asyncio.gather(
        *(offload.score_off_loop(BACKTRACKS, a, {}, Pool(2, 1.5)) for a in answers),
        return_exceptions=True,
    )
    values = [f.value if not isinstance(f, BaseException) else type(f).__name__ for f in found]
    assert values == [1.0, 0.0, "ScorerError", 1.0, "ScorerError", 0.0]


async def test_a_scorers_own_error_comes_back_with_its_detail() -> None:
    math = scorer_for({"kind": "math"})
    with pytest.raises(ScorerError, match="ground_truth") as raised:
        await offload.score_off_loop(math, "\\boxed{4}", {"ground_truth": {"no": 1}}, Pool(1, 30))
    assert isinstance(raised.value.detail, dict)
    score = await offload.score_off_loop(math, "\\boxed{4}", {"ground_truth": "4"}, Pool(1, 30))
    assert score.value == 1.0
