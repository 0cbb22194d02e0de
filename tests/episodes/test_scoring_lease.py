"""A deferred scorer's scoring lease (`app.bus.episodes.hold_scoring`): the reward route and
the sweep decide "nobody will score it" by that lease, not by the worker's heartbeat (a
worker restarted under the same name beats again but scores nothing of its predecessor's);
a failed store drops it; a step waits past its timeout only while its answer is scored;
a worker whose answer cannot be sent keeps serving its other episodes.

Real Postgres, Redis, Docker and `sandhive worker` processes throughout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from app.api.app import create_app
from app.bus import episodes as bus
from app.bus import keys
from app.config import Settings
from app.db import models
from app.db.engine import Sessions, create_engine, create_sessions
from app.schemas.episodes import EpisodeCreate
from app.services.episodes import service as episodes
from app.worker.episodes.reward import store_reward
from tests.api.conftest import assert_error, serve
from tests.episodes.conftest import (
    SUBMIT,
    containers,
    open_episode,
    step,
    tool_turn,
    wait_for,
    write_answer,
)
from tests.episodes.test_deferred_rewards import (
    HOSTILE,
    PROMPT,
    killed_while_scoring,
    python_scorer,
    remove,
    reward,
    scorers_of,
    stored_reward,
)
from tests.support.processes import ready_worker
from tests.support.zygote import AppProcess

STEP_TIMEOUT_S = 5.0
WORKER = "w-scoring"
SLOW = """
import time

def compute_score(agent_answer, ground_truth, **row):
    time.sleep(8)
    return 1.0
"""


@pytest.fixture
def episode_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    """A short step timeout (a scorer may take longer: the lease extends the wait), one
    worker name across restarts (as under compose: PID 1, the container's hostname)."""
    return make_episode_settings(
        episode_step_timeout_s=STEP_TIMEOUT_S, worker_name=WORKER, worker_reap_interval_s=0.5
    )


async def ended_unscored(settings: Settings, sessions: Sessions, worker: str) -> str:
    """A row as a worker leaves it once the loop ended with a submitted answer, before it
    stored the python scorer's reward."""
    body = EpisodeCreate(prompt=PROMPT, ground_truth="42", **python_scorer(HOSTILE))
    row = episodes.new_row(settings, "alice", body)
    row.status, row.finish_reason, row.answer, row.worker = "done", "submitted", "42", worker
    await episodes.store(sessions, settings, row)
    return row.id


async def hold(redis: Redis, episode_id: str, ttl_s: float = 600.0) -> None:
    await bus.hold_scoring(redis, episode_id, "someone", ttl_s)


async def test_the_reward_is_pending_while_the_lease_is_held_whatever_the_heartbeat(
    episode_settings: Settings, sessions: Sessions, redis: Redis
) -> None:
    async with serve(create_app(episode_settings)) as api:
        # No heartbeat at all (one missed, or a Redis restart): a held lease is a live scoring.
        scoring = await ended_unscored(episode_settings, sessions, "w-gone")
        await hold(redis, scoring)
        pending = assert_error(await reward(api, scoring), 409, "conflict")
        assert pending["details"] == {"reward": "pending", "scorer": "python"}
        assert await stored_reward(sessions, scoring) is None
        # Its worker beats (restarted under the same name) but nobody holds the lease.
        await redis.set(keys.worker_heartbeat("w-alive"), "{}", px=600_000)
        lost = await ended_unscored(episode_settings, sessions, "w-alive")
        refused = assert_error(await reward(api, lost), 409, "conflict")
        assert refused["details"]["error_kind"] == "infrastructure"
        assert "its worker w-alive was lost before it scored" in refused["message"]
        assert (await stored_reward(sessions, lost) or {})["error_kind"] == "infrastructure"
        # The lease dropped: the next call stores the infrastructure error.
        await bus.drop_scoring(redis, scoring)
        again = assert_error(await reward(api, scoring), 409, "conflict")
        assert again["details"]["error_kind"] == "infrastructure"


async def test_a_reward_that_cannot_be_stored_drops_the_lease_and_becomes_an_infrastructure_error(
    episode_settings: Settings, sessions: Sessions, redis: Redis
) -> None:
    episode_id = await ended_unscored(episode_settings, sessions, "w-alive")
    await hold(redis, episode_id)
    unreachable = create_engine("postgresql+asyncpg://postgres@127.0.0.1:1/nowhere")
    try:
        score = {"scorer": "python", "score": 1.0, "detail": {}, "error_kind": None}
        assert not await store_reward(create_sessions(unreachable), redis, episode_id, score)
    finally:
        await unreachable.dispose()
    assert not await bus.scoring(redis, [episode_id]), "dropped: nobody will store it"
    async with serve(create_app(episode_settings)) as api:
        refused = assert_error(await reward(api, episode_id), 409, "conflict")
    assert refused["details"]["error_kind"] == "infrastructure"
    # A reachable Postgres takes it at the first try, but once: the error stands now.
    assert await store_reward(sessions, redis, episode_id, score)
    assert (await stored_reward(sessions, episode_id) or {})["error_kind"] == "infrastructure"


async def test_the_sweep_and_a_restarted_worker_store_the_rewards_nobody_scores(
    episode_settings: Settings, sessions: Sessions, redis: Redis, tmp_path: Path
) -> None:
    # The sweep's query (a partial index's predicate) spells the deferred kinds itself.
    assert all(f"'{kind}'" in models.UNSCORED for kind in episodes.DEFERRED_KINDS)
    lost = await ended_unscored(episode_settings, sessions, "w-gone")
    scoring = await ended_unscored(episode_settings, sessions, "w-gone")
    await hold(redis, scoring)
    own = await ended_unscored(episode_settings, sessions, WORKER)
    await hold(redis, own)  # its predecessor's lease, not lapsed yet: it scores nothing now
    with ready_worker(episode_settings, tmp_path / "worker.log"):
        # Its own are stored before it logs "ready".
        mine = await stored_reward(sessions, own)
        assert mine is not None
        assert mine["error_kind"] == "infrastructure"
        assert f"its worker {WORKER} restarted before it scored" in mine["error"]

        async def swept(episode_id: str) -> bool:
            return await stored_reward(sessions, episode_id) is not None

        await wait_for("the sweep to store the lost reward", lambda: swept(lost), 30)
        found = await stored_reward(sessions, lost)
        assert found is not None
        assert (found["error_kind"], found["score"]) == ("infrastructure", None)
        assert "sweep" in found["error"]
        await asyncio.sleep(4 * episode_settings.worker_reap_interval_s)  # more sweeps
        assert await stored_reward(sessions, scoring) is None, "its lease is held: scoring"
        await bus.drop_scoring(redis, scoring)
        await wait_for("the sweep to store the dropped one", lambda: swept(scoring), 30)


async def test_a_worker_restarted_under_its_name_while_it_scores_leaves_no_reward_pending(
    episode_settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    async with serve(create_app(episode_settings)) as api:
        api.timeout = httpx.Timeout(120.0)
        with ready_worker(episode_settings, tmp_path / "doomed.log") as doomed:
            opened = await open_episode(api, prompt=PROMPT, **python_scorer(HOSTILE, 60))
            assert (await step(api, opened["id"], write_answer("loop"))).status_code == 200
            try:
                answered = await killed_while_scoring(api, doomed, opened["id"], WORKER)
                # The row says how it ended (submitted): that is the final step's answer.
                assert answered.status_code == 200, answered.text
                body = answered.json()
                assert (body["done"], body["finish_reason"], body["messages"]) == (
                    True,
                    "submitted",
                    [],
                )
            finally:
                await asyncio.to_thread(remove, scorers_of(WORKER))
                # Its sandbox: a worker of the same name looks alive to the reaper.
                await asyncio.to_thread(remove, containers(f"sandhive.episode={opened['id']}"))
        with ready_worker(episode_settings, tmp_path / "restarted.log"):
            refused = assert_error(await reward(api, opened["id"]), 409, "conflict")
            assert refused["details"]["error_kind"] == "infrastructure"
            assert f"its worker {WORKER} restarted before it scored" in refused["message"]


async def test_only_a_step_being_scored_waits_past_the_step_timeout(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    # The final step: its scorer takes longer than the step timeout; the lease says it runs.
    slow = await open_episode(api, prompt=PROMPT, **python_scorer(SLOW))
    assert (await step(api, slow["id"], write_answer("42"))).status_code == 200
    final = await step(api, slow["id"], SUBMIT)
    assert final.status_code == 200, final.text
    assert final.json()["timings"]["score_ms"] >= STEP_TIMEOUT_S * 1000
    assert (await reward(api, slow["id"])).json()["score"] == 1.0
    # Any other step of the same kind of episode gets only the step timeout.
    stuck = await open_episode(api, prompt=PROMPT, **python_scorer(SLOW))
    sleep = tool_turn("c1", "execute_bash", {"command": f"sleep {3 * STEP_TIMEOUT_S:.0f}"})
    lost = assert_error(await step(api, stuck["id"], sleep), 503, "unavailable")
    assert lost["details"]["finish_reason"] == "worker_lost"


async def test_an_answer_that_cannot_be_sent_stops_no_other_episode(
    worker: AppProcess, api: httpx.AsyncClient, redis: Redis, sessions: Sessions
) -> None:
    opened = await open_episode(api, prompt=PROMPT)
    # Reply keys of the wrong type: the worker's RPUSH of its answer fails (WRONGTYPE).
    for n, episode_id in enumerate(("unknown", opened["id"])):
        reply = f"{keys.PREFIX}:test:reply:{n}"
        await redis.set(reply, "not a list")
        request = {"op": "step", "episode_id": episode_id, "message": write_answer("1")}
        await redis.rpush(bus.requests_of(WORKER), json.dumps({**request, "reply": reply}))
    stepped = await step(api, opened["id"], write_answer("2"))
    assert stepped.status_code == 200, stepped.text
    assert stepped.json()["done"] is False
    assert worker.poll() is None
    other = await open_episode(api, prompt=PROMPT)
    assert (await step(api, other["id"], SUBMIT)).json()["finish_reason"] == "submitted"
    row = await episodes.find(sessions, "alice", opened["id"])
    assert row.status == "open"
