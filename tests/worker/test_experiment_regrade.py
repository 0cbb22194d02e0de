"""Regrade end to end: an experiment run and scored, then scored again with another scorer
by the workers' scoring loop, running no task; the earlier scoring stays readable.

Vanilla arms with scripted replies (no container per item), so every score of both
gradings is known: `exact` against each row's ground truth first, then a judge that finds
every answer CORRECT, then the built-in `contains`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.scripted import ScriptedLLMServer
from tests.support.experiments import event_log, scripted, settled, submit
from tests.worker.conftest import running_worker


def body(answerer: str, silent: str) -> dict[str, Any]:
    """Arm `v` always answers "The answer is 42"; arm `mute` gives none (an agent error)."""
    truths = {"q1": "The answer is 42", "q2": "7", "q3": "42"}
    return {
        "name": "regrade me",
        "dataset": {
            "rows": [
                {"id": row, "problem_statement": f"Solve {row}.", "ground_truth": truth}
                for row, truth in truths.items()
            ]
        },
        "arms": [
            {"name": "v", "mode": "vanilla", "task": {"llm": {"model": answerer}}},
            {"name": "mute", "mode": "vanilla", "task": {"llm": {"model": silent}}},
        ],
        "scorer": {"kind": "exact"},
        "concurrency": 6,
    }


async def test_a_regrade_scores_the_stored_answers_again_and_keeps_the_earlier_scoring(
    fast: Settings, client: httpx.AsyncClient, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "The answer is 42")
    silent = scripted(scripted_llm, "silent", "")
    judge = scripted(scripted_llm, "judge", "Equivalent.\nCORRECT")
    async with running_worker(fast):
        url = await submit(client, body(answerer, silent))
        first = await settled(client, url, "finished")
        assert first["grading"] == 1
        before = (await client.get(f"{url}/items")).json()["items"]
        assert [i["score"] for i in before if i["arm"] == "v"] == [1.0, 0.0, 0.0]

        judge_spec = {"kind": "llm_judge", "profile": "default", "model": judge}
        answer = await client.post(f"{url}/regrade", json={"scorer": judge_spec})
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "running"
        assert (answer.json()["grading"], answer.json()["scorer"]) == (2, judge_spec)
        again = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        assert again.status_code == 409, "still scoring"
        assert again.json()["error"]["code"] == "conflict"
        second = await settled(client, url, "finished")

        third_answer = await client.post(f"{url}/regrade", json={"scorer": {"kind": "contains"}})
        assert third_answer.status_code == 202, third_answer.text
        third = await settled(client, url, "finished")

    assert second["grading"] == 2
    assert second["progress"]["v"]["scored"] == 3
    assert second["progress"]["mute"]["error"] == 3, "no answer: nothing to regrade"
    assert third["grading"] == 3
    assert third["scorer"] == {"kind": "contains"}
    assert scripted_llm.requests[judge] == 3, "one verdict per stored answer"
    assert scripted_llm.requests[answerer] == 3, "no task ran again"
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 6

    items = (await client.get(f"{url}/items")).json()["items"]
    v = [i for i in items if i["arm"] == "v"]
    assert [i["score"] for i in v] == [1.0, 0.0, 1.0], "contains: q3's 42 is in it"
    q1 = v[0]
    assert [g["grading"] for g in q1["gradings"]] == [1, 2]
    assert q1["gradings"][0] == {
        "grading": 1,
        "scorer": {"kind": "exact"},
        "status": "scored",
        "score": 1.0,
        "error_kind": None,
        "detail": before[0]["detail"],
    }
    assert q1["gradings"][1]["scorer"] == judge_spec
    assert q1["gradings"][1]["detail"]["verdicts"] == [True]
    mute = next(i for i in items if i["arm"] == "mute")
    assert (mute["status"], mute["error_kind"]) == ("error", "agent")
    assert [g["status"] for g in mute["gradings"]] == ["error", "error"]

    def mean_of(results: dict[str, Any]) -> Any:
        return next(a["mean"] for a in results["arms"] if a["arm"] == "v")

    now = (await client.get(f"{url}/results")).json()
    original = (await client.get(f"{url}/results", params={"grading": 1})).json()
    judged = (await client.get(f"{url}/results", params={"grading": 2})).json()
    assert (now["grading"], mean_of(now)) == (3, pytest.approx(2 / 3))
    assert (original["grading"], mean_of(original)) == (1, pytest.approx(1 / 3))
    assert (judged["grading"], mean_of(judged)) == (2, 1.0)
    assert next(a for a in original["arms"] if a["arm"] == "mute")["errors"] == {"agent": 3}
    missing = await client.get(f"{url}/results", params={"grading": 4})
    assert missing.status_code == 422
    assert "gradings 1 to 3" in missing.json()["error"]["message"]

    log = await event_log(sessions, first["id"])
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    regrades = [e.data for e in log if e.type == "experiment.regrading"]
    assert regrades == [
        {"grading": 2, "scorer": judge_spec},
        {"grading": 3, "scorer": {"kind": "contains"}},
    ]
    assert [e.type for e in log].count("item.scored") == 6, "3 answers, twice"
    assert [e.type for e in log].count("experiment.finished") == 3
    assert log[-1].type == "experiment.finished"
