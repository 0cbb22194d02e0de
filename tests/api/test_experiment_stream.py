"""An experiment's event stream over real WebSockets and SSE, served by a real uvicorn.

Events are written as the runner writes them (recorded in a transaction, then a wake-up
published after the commit) while clients watch: replay then follow, resume at every
point, a lost wake-up, a regrade running a finished experiment again, Redis down, and a
real experiment advanced by the runner to its end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from redis.asyncio import Redis
from sqlalchemy import select, update

from app.bus.experiment_live import notify
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.resources import open_resources
from app.services.experiments import runner as experiment_runner
from app.services.experiments.events import record_experiment_events
from tests.api.live_server import LiveServer, live_server
from tests.api.test_stream import read_ws, stream_settings
from tests.support.experiments import ADMIN_KEY, as_tenant, experiment

WAIT_S = 30.0


def fast_settings(database_url: str, **overrides: Any) -> Settings:
    """Polls slower than any test waits for a woken event, so a wake-up is what brings it."""
    values = {"experiment_stream_poll_s": 10.0, "stream_keepalive_s": 15.0, **overrides}
    return stream_settings(database_url, **values)


@pytest.fixture
async def server(clean_db: str, redis: Redis) -> AsyncIterator[LiveServer]:
    async with live_server(fast_settings(clean_db)) as live:
        yield live


async def create(base_url: str, headers: dict[str, str] | None = None, **body: Any) -> str:
    async with httpx.AsyncClient(base_url=base_url) as client:
        answer = await client.post("/v1/experiments", json=experiment(**body), headers=headers)
    assert answer.status_code == 202, answer.text
    exp_id: str = answer.json()["id"]
    return exp_id


async def emit(
    sessions: Sessions, redis: Redis | None, exp_id: str, *types: str, status: str | None = None
) -> int:
    """Record events (and the experiment's new status) in one transaction; wake after it."""
    async with sessions.begin() as session:
        if status is not None:
            await session.execute(
                update(models.Experiment)
                .where(models.Experiment.id == exp_id)
                .values(status=status, finished_at=utc_now() if status != "running" else None)
            )
        recorded = await record_experiment_events(
            session, exp_id, [(type_, {"n": i}) for i, type_ in enumerate(types)]
        )
    seq = recorded[-1].seq
    if redis is not None:
        await notify(redis, exp_id, seq)
    return seq


async def finish(sessions: Sessions, redis: Redis | None, exp_id: str) -> int:
    return await emit(sessions, redis, exp_id, "experiment.finished", status="finished")


async def sse_lines(
    base_url: str, path: str, headers: dict[str, str] | None = None
) -> AsyncGenerator[str, None]:
    async with (
        httpx.AsyncClient(base_url=base_url) as client,
        client.stream("GET", path, headers=headers) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            yield line


async def read_sse(base_url: str, path: str, headers: dict[str, str] | None = None) -> list[Any]:
    """Every event's (id, event, data) until the server ends the response."""
    frames: list[Any] = []
    current: dict[str, str] = {}
    async with asyncio.timeout(WAIT_S):
        async for line in sse_lines(base_url, path, headers):
            if line == "":
                if "data" in current:
                    data = json.loads(current["data"])
                    frames.append((int(current["id"]), current["event"], data))
                current = {}
            elif not line.startswith((":", "retry:")):
                key, _, value = line.partition(": ")
                current[key] = value
    return frames


def seqs(messages: list[dict[str, Any]]) -> list[int]:
    return [m["seq"] for m in messages if m["type"] != "keepalive"]


async def test_replay_then_follow_ends_once_finished_over_websocket_and_sse(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    exp_id = await create(server.base_url)
    await emit(sessions, None, exp_id, "item.started", "item.started")
    ws_reader = asyncio.create_task(
        read_ws(f"{server.ws_url}/v1/experiments/{exp_id}/stream?after=0")
    )
    sse_reader = asyncio.create_task(read_sse(server.base_url, f"/v1/experiments/{exp_id}/events"))
    await asyncio.sleep(0.5)  # both followed the replay and now wait
    assert not ws_reader.done()
    assert not sse_reader.done()
    await emit(sessions, redis, exp_id, "item.ended", "item.ended", "item.started")
    await asyncio.sleep(0.3)
    last = await finish(sessions, redis, exp_id)
    async with asyncio.timeout(3):  # woken: the 10 s poll would come too late
        messages, code, _ = await ws_reader
        frames = await sse_reader
    assert code == 1000
    assert seqs(messages) == list(range(1, last + 1)) == [f[0] for f in frames]
    assert [m["type"] for m in messages][-1] == "experiment.finished"
    assert set(messages[0]) == {"seq", "type", "ts", "data"}
    assert [(f[1], f[2]) for f in frames] == [(m["type"], m) for m in messages]


async def test_resuming_at_every_point_sends_exactly_what_follows(
    server: LiveServer, sessions: Sessions
) -> None:
    exp_id = await create(server.base_url)
    await emit(sessions, None, exp_id, "item.started", "item.ended", "item.scored")
    last = await finish(sessions, None, exp_id)
    base = f"/v1/experiments/{exp_id}"
    for after in range(last):
        messages, code, _ = await read_ws(f"{server.ws_url}{base}/stream?after={after}")
        assert (seqs(messages), code) == (list(range(after + 1, last + 1)), 1000)
        by_header = await read_sse(server.base_url, f"{base}/events", {"Last-Event-ID": str(after)})
        by_query = await read_sse(server.base_url, f"{base}/events?after={after}")
        assert [f[0] for f in by_header] == [f[0] for f in by_query] == seqs(messages)
    messages, code, _ = await read_ws(f"{server.ws_url}{base}/stream?after={last}")
    assert (messages, code) == ([], 1000)
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        done = await client.get(f"{base}/events", headers={"Last-Event-ID": str(last)})
        assert done.status_code == 204, "an EventSource stops reconnecting"
        wins = await client.get(f"{base}/events?after=0", headers={"Last-Event-ID": str(last)})
        assert wins.status_code == 204, "Last-Event-ID wins over after"
        bad = await client.get(f"{base}/events?after=-1")
        assert bad.status_code == 422
        unknown = await client.get(f"{base}/events?since=1")
        assert unknown.status_code == 422


async def test_a_lost_wake_up_costs_one_poll(clean_db: str, sessions: Sessions) -> None:
    async with live_server(fast_settings(clean_db, experiment_stream_poll_s=0.2)) as live:
        exp_id = await create(live.base_url)
        reader = asyncio.create_task(read_ws(f"{live.ws_url}/v1/experiments/{exp_id}/stream"))
        await asyncio.sleep(0.3)
        await emit(sessions, None, exp_id, "item.started")  # no wake-up published
        last = await finish(sessions, None, exp_id)
        async with asyncio.timeout(5):
            messages, code, _ = await reader
    assert (seqs(messages), code) == (list(range(1, last + 1)), 1000)


async def test_a_regrade_keeps_a_finished_experiment_streaming(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    exp_id = await create(server.base_url)
    first = await finish(sessions, redis, exp_id)
    await emit(sessions, redis, exp_id, "experiment.regrading", status="running")
    reader = asyncio.create_task(read_ws(f"{server.ws_url}/v1/experiments/{exp_id}/stream"))
    await asyncio.sleep(0.5)
    assert not reader.done(), "an experiment.finished that is not the last event ends nothing"
    await emit(sessions, redis, exp_id, "item.scored", "item.scored")
    last = await finish(sessions, redis, exp_id)
    messages, code, _ = await reader
    assert (seqs(messages), code) == (list(range(1, last + 1)), 1000)
    assert [m["type"] for m in messages][first - 1 :: first + 1] == ["experiment.finished"] * 2


async def test_a_cancelled_experiment_ends_its_stream(
    server: LiveServer, clean_db: str, sessions: Sessions
) -> None:
    exp_id = await create(server.base_url)
    reader = asyncio.create_task(read_ws(f"{server.ws_url}/v1/experiments/{exp_id}/stream"))
    await asyncio.sleep(0.3)
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        cancelled = await client.post(f"/v1/experiments/{exp_id}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    async with asyncio.timeout(WAIT_S):
        messages, code, _ = await reader
    assert code == 1000
    assert messages[-1]["type"] == "experiment.cancelled"
    settings = fast_settings(clean_db)
    async with open_resources(settings) as res:  # its running items end after the cancel
        await experiment_runner.advance_all(res.sessions, res.redis, settings)
    async with asyncio.timeout(WAIT_S):
        replayed, code, _ = await read_ws(f"{server.ws_url}/v1/experiments/{exp_id}/stream")
    assert code == 1000, "no item left to end: nothing more will come"
    assert [m["type"] for m in replayed[len(messages) :]] == ["item.ended", "item.ended"]
    assert seqs(replayed) == list(range(1, len(replayed) + 1))


async def test_idle_streams_get_keepalives(clean_db: str, sessions: Sessions) -> None:
    async with live_server(fast_settings(clean_db, stream_keepalive_s=0.3)) as live:
        exp_id = await create(live.base_url)
        caught_up = "after=1000000"  # past the item.started events of its creation
        async with websockets.connect(
            f"{live.ws_url}/v1/experiments/{exp_id}/stream?{caught_up}"
        ) as ws:
            async with asyncio.timeout(WAIT_S):
                message = json.loads(await ws.recv())
        assert (message["type"], message["seq"], message["data"]) == ("keepalive", None, {})
        async with asyncio.timeout(WAIT_S):
            lines = sse_lines(live.base_url, f"/v1/experiments/{exp_id}/events?{caught_up}")
            assert await anext(lines) == "retry: 2000"
            while (line := await anext(lines)) == "":
                pass
            assert line == ": keepalive"
            await lines.aclose()


async def test_unknown_and_foreign_experiments_are_not_found(clean_db: str) -> None:
    settings = fast_settings(clean_db, auth="keys", admin_api_key=ADMIN_KEY)
    alice, bob = as_tenant("alice"), as_tenant("bob")
    async with live_server(settings) as live:
        foreign = await create(live.base_url, alice)
        for exp_id in ("exp_nope", foreign):
            url = f"{live.ws_url}/v1/experiments/{exp_id}/stream"
            messages, code, _ = await read_ws(url, additional_headers=bob)
            assert (messages, code) == ([], 4404)
            async with httpx.AsyncClient(base_url=live.base_url) as client:
                answer = await client.get(f"/v1/experiments/{exp_id}/events", headers=bob)
            assert (answer.status_code, answer.json()["error"]["code"]) == (404, "not_found")
        url = f"{live.ws_url}/v1/experiments/{foreign}/stream"
        missing, code_missing, _ = await read_ws(url)
        assert (missing, code_missing) == ([], 4401)
        async with httpx.AsyncClient(base_url=live.base_url) as client:
            assert (await client.get(f"/v1/experiments/{foreign}/events")).status_code == 401
        by_token, code_token, _ = await read_ws(f"{url}?token={ADMIN_KEY}")
        assert (by_token, code_token) == ([], 4404), "?token= read: tenant `admin`, not alice"


async def test_the_tenants_stream_cap_applies(clean_db: str, sessions: Sessions) -> None:
    async with live_server(fast_settings(clean_db, stream_max_per_tenant=1)) as live:
        exp_id = await create(live.base_url)
        url = f"{live.ws_url}/v1/experiments/{exp_id}/stream"
        async with websockets.connect(url) as held:
            await asyncio.sleep(0.2)
            messages, code, _ = await read_ws(url)
            assert (messages, code) == ([], 4429)
            async with httpx.AsyncClient(base_url=live.base_url) as client:
                answer = await client.get(f"/v1/experiments/{exp_id}/events")
            assert answer.status_code == 429
            assert "retry-after" in answer.headers
            await held.close()
        await asyncio.sleep(0.2)
        reader = asyncio.create_task(read_ws(url))
        await asyncio.sleep(0.3)
        last = await finish(sessions, None, exp_id)
        messages, code, _ = await reader
        assert (seqs(messages), code) == (list(range(1, last + 1)), 1000), "the slot came back"


async def test_without_redis_the_stream_polls_postgres(clean_db: str, sessions: Sessions) -> None:
    async with live_server(fast_settings(clean_db)) as live:
        exp_id = await create(live.base_url)
    down = fast_settings(clean_db, redis_url="redis://127.0.0.1:9/0", experiment_stream_poll_s=0.2)
    async with live_server(down) as live:
        reader = asyncio.create_task(read_ws(f"{live.ws_url}/v1/experiments/{exp_id}/stream"))
        sse = asyncio.create_task(read_sse(live.base_url, f"/v1/experiments/{exp_id}/events"))
        await asyncio.sleep(0.3)
        await emit(sessions, None, exp_id, "item.started")
        last = await finish(sessions, None, exp_id)
        async with asyncio.timeout(10):
            messages, code, _ = await reader
            frames = await sse
    assert (seqs(messages), code) == (list(range(1, last + 1)), 1000)
    assert [f[0] for f in frames] == seqs(messages)


async def test_without_postgres_a_stream_is_refused_with_503_and_1013(
    clean_db: str, redis: Redis
) -> None:
    down = fast_settings("postgresql+asyncpg://postgres@127.0.0.1:9/nope")
    async with live_server(down) as live:
        messages, code, _ = await read_ws(f"{live.ws_url}/v1/experiments/exp_x/stream")
        assert (messages, code) == ([], 1013)
        async with httpx.AsyncClient(base_url=live.base_url) as client:
            answer = await client.get("/v1/experiments/exp_x/events")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "database_unavailable"
    assert "retry-after" in answer.headers


async def test_a_real_experiment_streams_to_its_end(
    server: LiveServer, clean_db: str, sessions: Sessions
) -> None:
    """Events as the runner records them: items start, their tasks end, scored, finished."""
    exp_id = await create(server.base_url, arms=[{"name": "a"}], concurrency=3)
    reader = asyncio.create_task(read_ws(f"{server.ws_url}/v1/experiments/{exp_id}/stream"))
    sse = asyncio.create_task(read_sse(server.base_url, f"/v1/experiments/{exp_id}/events"))
    settings = fast_settings(clean_db)
    async with sessions.begin() as session:
        started = await session.execute(
            select(models.ExperimentItem.row_id, models.ExperimentItem.task_id).where(
                models.ExperimentItem.experiment_id == exp_id
            )
        )
        answers = {"q1": "\\boxed{2}", "q2": "\\boxed{4}", "q3": "\\boxed{7}"}  # truths 2, 4, 6
        for row_id, task_id in started:
            answer = answers[row_id]
            await session.execute(
                update(models.Task)
                .where(models.Task.id == task_id)
                .values(status="succeeded", finish_reason="submitted", answer=answer)
            )
    async with open_resources(settings) as res:
        await experiment_runner.advance_all(res.sessions, res.redis, settings)
    async with asyncio.timeout(WAIT_S):
        messages, code, _ = await reader
        frames = await sse
    assert code == 1000
    types = [m["type"] for m in messages]
    assert types.count("item.started") == 3
    assert types[-1] == "experiment.finished"
    assert seqs(messages) == list(range(1, len(messages) + 1)) == [f[0] for f in frames]
    ended = [m["data"] for m in messages if m["type"] == "item.ended"]
    assert sorted((d["row_id"], d["status"], d["score"]) for d in ended) == [
        ("q1", "scored", 1.0),
        ("q2", "scored", 1.0),
        ("q3", "scored", 0.0),
    ]
