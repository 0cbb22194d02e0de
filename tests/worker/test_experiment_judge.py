"""`llm_judge` end to end: a real in-process worker runs the items (vanilla, so no
container per item) and its scoring loop asks the scripted model, playing the judge, for
a verdict on each answer, outside the advancing transaction.

The judge's replies are chosen by the test, so every score is known; what the judge was
sent and said is read back from each item's detail, and the experiment's events and the
worker's scorer metrics are checked alongside.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from prometheus_client import generate_latest
from sqlalchemy import select

from app import metrics
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.scripted import Script, ScriptedLLMServer, Turn
from app.worker.pool import Worker
from tests.support.experiments import event_log, progress, scripted, settled, submit
from tests.worker.conftest import running_worker


def body(answerer: str, scorer: dict[str, Any], rows: int = 3) -> dict[str, Any]:
    return {
        "name": "judged",
        "dataset": {
            "rows": [
                {
                    "id": f"q{i}",
                    "problem_statement": f"What is {i} + {i}?",
                    "ground_truth": str(2 * i),
                }
                for i in range(rows)
            ]
        },
        "arms": [{"name": "v", "mode": "vanilla", "task": {"llm": {"model": answerer}}}],
        "scorer": scorer,
        "concurrency": 4,
    }


def sample(name: str, labels: dict[str, str]) -> float:
    found = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def test_the_judge_scores_every_answer_by_majority_over_its_repeats(
    fast: Settings, client: httpx.AsyncClient, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "<think>hmm</think>The answer is 4.")
    judge = scripted(scripted_llm, "judge", "It matches the official answer.\nCORRECT")
    timed = sample("sandhive_worker_scorer_seconds_count", {"kind": "llm_judge"})
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge, "repeats": 3}
    async with running_worker(fast):
        url = await submit(client, body(answerer, scorer))
        done = await settled(client, url, "finished")

    assert done["progress"]["v"] == progress(scored=3)
    assert scripted_llm.requests[judge] == 9, "3 repeats for each of 3 answers, no more"
    items = (await client.get(f"{url}/items")).json()["items"]
    assert [item["score"] for item in items] == [1.0, 1.0, 1.0]
    detail = items[1]["detail"]
    assert detail["verdicts"] == [True, True, True]
    assert detail["model"] == judge
    assert [e["reply"] for e in detail["exchanges"]] == [
        "It matches the official answer.\nCORRECT"
    ] * 3
    assert all(e["prompt_tokens"] > 0 for e in detail["exchanges"])
    (sent,) = detail["prompt"]
    assert "What is 1 + 1?" in sent["content"]
    assert "OFFICIAL ANSWER:\n2" in sent["content"]
    assert "The answer is 4." in sent["content"]
    assert "hmm" not in sent["content"], "what the answerer thought is not its answer"
    last = scripted_llm.last_request(judge)
    assert last is not None
    assert last["messages"] in [item["detail"]["prompt"] for item in items]
    assert not last.get("tools")
    assert last["temperature"] == 0.7
    results = (await client.get(f"{url}/results")).json()
    assert (results["arms"][0]["n"], results["arms"][0]["mean"]) == (3, 1.0)

    # Gapless events: each item started, ended `scoring`, then scored; then the end.
    log = await event_log(sessions, done["id"])
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    types = [e.type for e in log]
    assert types.count("item.started") == 3
    assert types.count("item.ended") == 3
    assert types.count("item.scored") == 3
    assert types[-1] == "experiment.finished"
    assert types.count("experiment.finished") == 1
    assert log[-1].data == {"status": "finished"}
    ended = [e.data for e in log if e.type == "item.ended"]
    assert {e["status"] for e in ended} == {"scoring"}
    assert all(e["task_id"] for e in ended)
    for row in ("q0", "q1", "q2"):
        mine = [e.type for e in log if e.data.get("row_id") == row]
        assert mine == ["item.started", "item.ended", "item.scored"]
    scored = next(e.data for e in log if e.type == "item.scored")
    assert (scored["status"], scored["score"], scored["error_kind"]) == ("scored", 1.0, None)
    assert sample("sandhive_worker_scorer_seconds_count", {"kind": "llm_judge"}) == timed + 3
    assert b"sandhive_worker_scorer_seconds_bucket" in generate_latest(metrics.REGISTRY)


async def test_a_judge_that_answers_garbage_makes_each_item_a_scorer_error_not_a_zero(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "4")
    judge = scripted(scripted_llm, "garbage", "Well, who is to say what is right?")
    errors = sample("sandhive_worker_scorer_errors_total", {"kind": "llm_judge"})
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge, "aggregate": "mean"}
    async with running_worker(fast):
        url = await submit(client, body(answerer, scorer, rows=2))
        done = await settled(client, url, "finished")
    assert (done["progress"]["v"]["error"], done["progress"]["v"]["scored"]) == (2, 0)
    items = (await client.get(f"{url}/items")).json()["items"]
    for item in items:
        assert (item["status"], item["error_kind"], item["score"]) == ("error", "scorer", None)
        assert "has no verdict" in item["detail"]["message"]
        assert item["detail"]["exchanges"] == [
            {
                "reply": "Well, who is to say what is right?",
                "prompt_tokens": item["detail"]["exchanges"][0]["prompt_tokens"],
                "completion_tokens": item["detail"]["exchanges"][0]["completion_tokens"],
            }
        ]
    arm = (await client.get(f"{url}/results")).json()["arms"][0]
    assert (arm["n"], arm["mean"], arm["errors"]) == (0, None, {"scorer": 2})
    assert sample("sandhive_worker_scorer_errors_total", {"kind": "llm_judge"}) == errors + 2


async def test_a_judge_out_of_reach_is_tried_again_then_not_scored_never_a_zero(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "4")
    judge = f"down-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(judge, Script([Turn(content="CORRECT")], tools="none", fail_status=500))
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge, "repeats": 2}
    quick = {"llm_max_retries": 0, "experiment_scoring_retry_s": 0.2}
    async with running_worker(fast.model_copy(update=quick)):
        url = await submit(client, {**body(answerer, scorer, rows=1), "infrastructure_retries": 2})
        await settled(client, url, "finished")
    (item,) = (await client.get(f"{url}/items")).json()["items"]
    assert (item["status"], item["error_kind"], item["score"]) == ("error", "infrastructure", None)
    assert item["detail"]["message"].startswith("the judge's call failed: LLM endpoint")
    assert "HTTP 500" in item["detail"]["message"]
    assert len(item["detail"]["exchanges"]) == 2
    assert all("error" in e for e in item["detail"]["exchanges"])
    assert scripted_llm.requests[judge] == 3 * 2, "tried 1 + 2 retries times, 2 repeats each"
    (arm,) = (await client.get(f"{url}/results")).json()["arms"]
    assert (arm["mean"], arm["coverage"]["scored"], arm["coverage"]["not_scored"]) == (None, 0, 1)


async def test_a_judge_back_within_the_retries_scores_the_answer(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "4")
    judge = f"flaky-{uuid.uuid4().hex[:8]}"
    script = Script([Turn(content="CORRECT")], tools="none", fail_status=503, fail_count=2)
    scripted_llm.add_script(judge, script)
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge, "repeats": 2}
    quick = {"llm_max_retries": 0, "experiment_scoring_retry_s": 0.2}
    async with running_worker(fast.model_copy(update=quick)):
        url = await submit(client, body(answerer, scorer, rows=1))  # 1 retry by default
        await settled(client, url, "finished")
    (item,) = (await client.get(f"{url}/items")).json()["items"]
    assert (item["status"], item["score"]) == ("scored", 1.0)
    assert scripted_llm.requests[judge] == 4  # the first try's two calls failed


async def test_a_judge_that_refuses_the_request_is_a_scorer_error_at_once(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "4")
    judge = f"refuses-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(judge, Script([Turn(content="CORRECT")], tools="none", fail_status=400))
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge}
    async with running_worker(fast.model_copy(update={"llm_max_retries": 0})):
        url = await submit(client, body(answerer, scorer, rows=1))
        await settled(client, url, "finished")
    (item,) = (await client.get(f"{url}/items")).json()["items"]
    assert (item["status"], item["error_kind"]) == ("error", "scorer")
    assert "HTTP 400" in item["detail"]["message"]
    assert scripted_llm.requests[judge] == 1, "a refusal is not retried"


async def test_a_worker_stopped_while_judging_gives_the_answer_back_to_another_at_once(
    fast: Settings, client: httpx.AsyncClient, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    answerer = scripted(scripted_llm, "answers", "4")
    judge = scripted(scripted_llm, "slow-judge", "CORRECT", delay_s=2.0)
    long_lease = fast.model_copy(
        update={"experiment_scoring_timeout_s": 300.0, "experiment_scoring_lease_margin_s": 300.0}
    )
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge}
    first = Worker(long_lease)
    running = asyncio.create_task(first.run())
    try:
        created = await client.post("/v1/experiments", json=body(answerer, scorer, rows=1))
        url = f"/v1/experiments/{created.json()['id']}"
        deadline = time.monotonic() + 60
        while scripted_llm.requests.get(judge, 0) == 0:  # the judge was asked once
            assert time.monotonic() < deadline, "the first worker never asked the judge"
            await asyncio.sleep(0.05)
    finally:
        first.stop()
        first.stop()  # stops mid-call, before the judge replies
        await asyncio.wait_for(running, 60)
    exp = (await client.get(url)).json()
    assert exp["progress"]["v"]["scoring"] == 1, "nobody wrote a score"
    async with sessions() as session:
        (item,) = await session.scalars(
            select(models.ExperimentItem).where(models.ExperimentItem.experiment_id == exp["id"])
        )
    assert item.scoring_until is None, "the stopping worker gave its 10-minute lease back"
    assert item.scoring_claims == 0, "a stop is not a failed try"

    async with running_worker(long_lease):
        done = await settled(client, url, "finished", timeout_s=60)  # well within the lease
    assert done["progress"]["v"]["scored"] == 1
    assert scripted_llm.requests[judge] == 2, "judged again by the next worker"
    log = await event_log(sessions, exp["id"])
    assert [e.type for e in log].count("item.scored") == 1, "stored once"
