"""The scoring lease (services.experiment_scoring): claimed once, rescored after a crash,
stored once, each store one gapless `item.scored` event.

Service level on real Postgres: items are put in `scoring` directly, and two claimers race
as two workers would. The loop end to end (a worker, a judge) is
tests/worker/test_experiment_judge.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.scoring.python_code import PythonScorer
from app.scoring.registry import scorer_for
from app.scoring.types import Score, ScorerError
from app.services.experiments.rows import store_rows
from app.services.experiments.runner import record_end
from app.services.experiments.scoring import (
    build_scorer,
    claim,
    release,
    stored_scorer,
    write_score,
)

Item = models.ExperimentItem
EVENTS = models.ExperimentEvent


async def waiting_experiment(sessions: Sessions, n: int, exp_id: str = "exp_scoring") -> str:
    """An experiment whose `n` items all wait for a judge; the even rows stored as this
    release stores them (once, in `experiment_rows`), the odd ones as a copy on the item, as
    earlier releases did: a claim reads both."""
    scorer = {"kind": "llm_judge", "profile": "default"}
    arms = [{"name": "a", "mode": "vanilla", "task": {}}]
    async with sessions.begin() as session:
        session.add(
            models.Experiment(
                id=exp_id,
                tenant_id="t1",
                name="scoring",
                status="running",
                spec={"arms": arms, "scorer": scorer, "attempts": 1, "concurrency": 8},
                meta={},
            )
        )
        await session.flush()
        rows = [{"id": f"q{i}", "problem_statement": "p", "ground_truth": "1"} for i in range(n)]
        await store_rows(session, exp_id, rows[::2])
        await session.execute(
            insert(Item),
            [
                {
                    "experiment_id": exp_id,
                    "row_id": f"q{i}",
                    "arm": "a",
                    "attempt": 1,
                    "seq": i,
                    "own_row": rows[i] if i % 2 else None,
                    "status": "scoring",
                    "answer": f"answer {i}",
                    "detail": {},
                    "updated_at": utc_now(),
                }
                for i in range(n)
            ],
        )
    return exp_id


async def items(sessions: Sessions, exp_id: str) -> list[models.ExperimentItem]:
    async with sessions() as session:
        query = select(Item).where(Item.experiment_id == exp_id).order_by(Item.seq)
        return list(await session.scalars(query))


async def events(sessions: Sessions, exp_id: str) -> list[models.ExperimentEvent]:
    async with sessions() as session:
        query = select(EVENTS).where(EVENTS.experiment_id == exp_id).order_by(EVENTS.seq)
        return list(await session.scalars(query))


async def test_two_claimers_at_once_take_disjoint_items_and_a_lease_keeps_them(
    sessions: Sessions,
) -> None:
    exp_id = await waiting_experiment(sessions, 10)
    first, second = await asyncio.gather(
        claim(sessions, limit=6, lease_s=60), claim(sessions, limit=6, lease_s=60)
    )
    taken_first = {c.row_id for c in first}
    taken_second = {c.row_id for c in second}
    assert not taken_first & taken_second, "SKIP LOCKED: no item claimed twice"
    assert taken_first | taken_second == {f"q{i}" for i in range(10)}
    assert sorted((len(first), len(second))) == [4, 6]
    assert await claim(sessions, limit=10, lease_s=60) == [], "every lease is live"
    leased = await items(sessions, exp_id)
    assert all(item.scoring_until is not None for item in leased)
    one = first[0]
    assert (one.scorer, one.answer) == (
        {"kind": "llm_judge", "profile": "default"},
        f"answer {one.row_id[1:]}",
    )
    assert all(
        c.row == {"id": c.row_id, "problem_statement": "p", "ground_truth": "1"}
        for c in first + second
    )


async def test_an_expired_lease_is_taken_again_and_only_the_new_holder_stores_its_score(
    sessions: Sessions,
) -> None:
    exp_id = await waiting_experiment(sessions, 1)
    (crashed,) = await claim(sessions, limit=5, lease_s=60)
    async with sessions.begin() as session:  # the first worker died: its lease runs out
        await session.execute(update(Item).values(scoring_until=utc_now() - timedelta(seconds=1)))
    (retaken,) = await claim(sessions, limit=5, lease_s=60)
    assert retaken.row_id == crashed.row_id
    assert retaken.lease != crashed.lease

    stored = await write_score(sessions, retaken, Score(1.0, {"verdicts": [True]}))
    assert [(e.seq, e.type) for e in stored] == [(1, "item.scored")]
    late = await write_score(sessions, crashed, Score(0.0, {"verdicts": [False]}))
    assert late == [], "the dead worker's late write matches no row"
    again = await write_score(sessions, retaken, Score(0.0))
    assert again == [], "stored once: the item is no longer `scoring`"

    (item,) = await items(sessions, exp_id)
    assert (item.status, item.score, item.error_kind) == ("scored", 1.0, None)
    assert item.detail == {"verdicts": [True]}
    assert item.scoring_until is None
    (event,) = await events(sessions, exp_id)
    assert (event.seq, event.type) == (1, "item.scored")
    assert event.data == {
        "row_id": "q0",
        "arm": "a",
        "attempt": 1,
        "status": "scored",
        "score": 1.0,
        "error_kind": None,
    }


async def test_a_scorer_error_is_stored_as_an_error_of_kind_scorer_with_its_detail(
    sessions: Sessions,
) -> None:
    exp_id = await waiting_experiment(sessions, 3)
    claimed = await claim(sessions, limit=3, lease_s=60)
    failure = ScorerError(
        "the judge's reply 1 of 1 has no verdict", {"exchanges": [{"reply": "?"}]}
    )
    results = await asyncio.gather(
        write_score(sessions, claimed[0], failure),
        write_score(sessions, claimed[1], Score(0.0)),
        write_score(sessions, claimed[2], Score(1.0)),
    )
    assert all(len(found) == 1 for found in results)
    first, *_ = await items(sessions, exp_id)
    assert (first.status, first.score, first.error_kind) == ("error", None, "scorer")
    assert first.detail == {
        "message": "the judge's reply 1 of 1 has no verdict",
        "exchanges": [{"reply": "?"}],
    }
    recorded = await events(sessions, exp_id)
    assert [e.seq for e in recorded] == [1, 2, 3], "concurrent writers, gapless seqs"
    async with sessions() as session:
        exp = await session.get(models.Experiment, exp_id)
        assert exp is not None
        assert exp.event_seq == 3


def test_an_answer_for_a_slow_scorer_waits_in_scoring_free_for_any_worker() -> None:
    judge = scorer_for({"kind": "llm_judge", "profile": "default"})
    answered = models.ExperimentItem(status="running", detail={})
    now = utc_now()
    task = models.Task(
        id="tsk_x",
        status="succeeded",
        finish_reason="submitted",
        answer="1",
        usage={},
        started_at=now,
        finished_at=now,
    )
    record_end(answered, task, judge, None, to_score=task.answer)
    assert (answered.status, answered.score, answered.scoring_until) == ("scoring", None, None)
    assert answered.answer == "1"
    silent = models.ExperimentItem(status="running", detail={})
    task.answer = None
    record_end(silent, task, judge, None, to_score=None)
    assert (silent.status, silent.error_kind) == ("error", "agent"), "nothing to judge"


async def test_claims_are_counted_and_a_released_lease_is_taken_again_at_once(
    sessions: Sessions,
) -> None:
    exp_id = await waiting_experiment(sessions, 1)
    (first,) = await claim(sessions, limit=5, lease_s=600)
    assert first.claims == 1
    assert await claim(sessions, limit=5, lease_s=600) == []
    assert await release(sessions, first), "given back by a worker that stops"
    (item,) = await items(sessions, exp_id)
    assert (item.scoring_until, item.scoring_claims) == (None, 0), "not counted as a try"
    (second,) = await claim(sessions, limit=5, lease_s=600)
    assert second.claims == 1
    assert not await release(sessions, first), "not the holder's lease any more"
    async with sessions.begin() as session:  # the holder died: its lease runs out
        await session.execute(update(Item).values(scoring_until=utc_now() - timedelta(seconds=1)))
    (third,) = await claim(sessions, limit=5, lease_s=600)
    assert third.claims == 2


async def test_scorer_text_postgres_cannot_take_is_stored_made_safe(sessions: Sessions) -> None:
    exp_id = await waiting_experiment(sessions, 2)
    one, two = await claim(sessions, limit=2, lease_s=60)
    failure = ScorerError("raised \ud800 here\x00", {"stderr": "x\udfff", "seconds": float("nan")})
    assert await write_score(sessions, one, failure)
    assert await write_score(sessions, two, Score(0.5, {"\ud83d": [float("inf"), "ok"]}))
    first, second = await items(sessions, exp_id)
    assert first.detail == {"message": "raised ? here\ufffd", "stderr": "x?", "seconds": "nan"}
    assert (second.status, second.detail) == ("scored", {"?": ["inf", "ok"]})


def test_a_stored_scorer_is_built_once_and_not_held_to_lowered_maxima(settings: Settings) -> None:
    spec = {"kind": "python", "code": "def compute_score(a, g, **row):\n    return 1\n"}
    lowered = settings.model_copy(update={"experiment_python_scorer_max_timeout_s": 100})
    assert build_scorer(spec, settings) is build_scorer(dict(spec), settings), "parsed once"
    slow = {**spec, "timeout_s": 200}
    with pytest.raises(ValueError, match="timeout_s"):
        build_scorer(slow, lowered)  # a new one is refused
    stored = stored_scorer(slow, lowered)  # one accepted before still runs
    assert isinstance(stored, PythonScorer)
    assert stored.timeout_s == 200
