"""What must not keep an experiment from ending: a stored scorer the server's lowered
limits would now refuse, another experiment that cannot be advanced, scorer output Postgres
cannot store (a lone surrogate), an answer whose scoring never comes back.

A real in-process worker and Docker; the broken states are written to Postgres directly,
as an older version or a crash would have left them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.scripted import Script, ScriptedLLMServer, Turn
from app.worker.context import WorkerContext
from app.worker.scoring import score_waiting
from tests.api.conftest import serve
from tests.support.experiments import insert_one_item_experiment, insert_scoring_item
from tests.worker.conftest import running_worker

Item = models.ExperimentItem
UNDER_WAY = ("pending", "running", "scoring")


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "experiment_tick_s": 0.2,
            "worker_concurrency": 4,
            "experiment_python_scorer_max_timeout_s": 300,
        }
    )


@pytest.fixture
async def client(fast: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(fast)) as client:
        yield client


async def settled(client: httpx.AsyncClient, url: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exp = (await client.get(url)).json()
        busy = any(p[s] for p in exp["progress"].values() for s in UNDER_WAY)
        if exp["status"] == "finished" and not busy:
            return exp
        await asyncio.sleep(0.3)
    raise AssertionError(f"{url} did not finish: {exp}")


async def broken_experiment(sessions: Sessions) -> str:
    """Older than any other, with a pending item and a spec advancing cannot read."""
    spec = {"scorer": {"kind": "math"}, "attempts": 1}  # no arms, no concurrency
    return await insert_one_item_experiment(
        sessions,
        spec,
        prefix="exp_broken",
        status="pending",
        experiment_created_at=utc_now().replace(year=2020),
    )


SCORER = """
def compute_score(agent_answer, ground_truth, **row):
    if row["id"] == "q2":
        raise ValueError("no \\ud800 way")
    return 1.0
"""


async def test_a_lowered_maximum_a_broken_experiment_and_a_lone_surrogate_stop_nothing(
    fast: Settings,
    client: httpx.AsyncClient,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
) -> None:
    model = f"answers-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(model, Script([Turn(content="42")], tools="none"))
    broken = await broken_experiment(sessions)
    body = {
        "name": "accepted under higher limits",
        "dataset": {
            "rows": [
                {"id": f"q{i}", "problem_statement": "6 * 7?", "ground_truth": "42"}
                for i in range(1, 4)
            ]
        },
        "arms": [{"name": "v", "mode": "vanilla", "task": {"llm": {"model": model}}}],
        "scorer": {"kind": "python", "code": SCORER, "timeout_s": 200},
        "concurrency": 4,
    }
    created = await client.post("/v1/experiments", json=body)
    assert created.status_code == 202, created.text
    url = f"/v1/experiments/{created.json()['id']}"
    lowered = fast.model_copy(update={"experiment_python_scorer_max_timeout_s": 100})
    async with running_worker(lowered):
        done = await settled(client, url)

    assert done["progress"]["v"]["scored"] == 2
    items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
    assert (items["q1"]["score"], items["q3"]["score"]) == (1.0, 1.0)
    q2 = items["q2"]
    assert (q2["status"], q2["error_kind"]) == ("error", "scorer")
    assert q2["detail"]["message"] == "python scorer: compute_score raised ValueError: no ? way"
    async with sessions() as session:
        still = await session.get(models.Experiment, broken)
        assert still is not None
        assert still.status == "running", "left as it was (and logged)"


async def the_item(ctx: WorkerContext, exp_id: str) -> models.ExperimentItem:
    async with ctx.sessions() as session:
        (item,) = await session.scalars(select(Item).where(Item.experiment_id == exp_id))
    return item


async def test_an_answer_claimed_the_maximum_times_without_a_result_is_not_scored(
    ctx: WorkerContext,
) -> None:
    """Each claim died (its worker lost, Docker unreachable): the infrastructure's failure,
    left out of the results as such, never the scorer's verdict on the answer."""
    limit = ctx.settings.experiment_scoring_max_claims
    exp_id = await insert_scoring_item(
        ctx.sessions, {"kind": "llm_judge", "profile": "default"}, claims=limit
    )
    assert await score_waiting(ctx) == 1
    item = await the_item(ctx, exp_id)
    assert (item.status, item.error_kind, item.score) == ("error", "infrastructure", None)
    assert item.detail["message"].startswith("scoring failed 3 times")
    assert item.scoring_until is None


async def test_docker_failing_a_python_scorer_is_retried_not_the_answers_error(
    ctx: WorkerContext,
) -> None:
    """The scorer's sandbox cannot be made (here: its image is gone). That says nothing of
    the answer: the claim is given back to be tried again after a backoff (doubled each
    time), and only a run of such tries ends the item, as `infrastructure`, which a
    regrade scores again."""
    update = {"sandbox_image": "sandhive-gone:none", "experiment_scoring_retry_s": 0.2}
    broken = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=update))
    code = "def compute_score(agent_answer, ground_truth, **row):\n    return 1.0\n"
    exp_id = await insert_scoring_item(broken.sessions, {"kind": "python", "code": code})
    for claim in range(1, broken.settings.experiment_scoring_max_claims + 1):
        assert await score_waiting(broken) == 1
        item = await the_item(broken, exp_id)
        assert (item.status, item.scoring_claims) == ("scoring", claim)
        assert item.scoring_until is not None, "tried again later, not at once"
        assert await score_waiting(broken) == 0, "not before its backoff"
        await asyncio.sleep(0.2 * 2 ** (claim - 1) + 0.1)
    assert await score_waiting(broken) == 1
    item = await the_item(broken, exp_id)
    assert (item.status, item.error_kind) == ("error", "infrastructure")
    assert item.detail["stage"] == "scoring"
