"""services.events: the "replay, then follow" stream, driven directly against Postgres and Redis.

Events are written the way the worker writes them (commit, then publish), at
awkward moments: while a follower is in the middle of its replay, committed
but published late, or never published at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from app.bus.fanout import LiveHub, SlowConsumer
from app.db.engine import Sessions
from app.db.models import Task
from app.errors import NotFound
from app.schemas.tasks import EventOut
from app.services import events
from app.services.events import StreamEvent, open_stream, record_event
from tests.support.processes import free_port
from tests.support.rows import insert_task
from tests.support.settings import REDIS_URL

TICK_S = 0.2
WAIT_S = 10.0


@pytest.fixture
async def hub(redis: Redis) -> AsyncIterator[LiveHub]:
    live_hub = LiveHub(redis, buffer=1000, tick_s=TICK_S)
    yield live_hub
    await live_hub.aclose()


async def emit(
    sessions: Sessions,
    redis: Redis,
    task_id: str,
    type_: str = "step.started",
    publish: bool = True,
) -> EventOut:
    """What the worker does: commit a durable event, then (normally) publish it."""
    async with sessions.begin() as session:
        event = await record_event(session, task_id, type_, {"note": type_})
    if publish:
        await events.publish(redis, event)
    return event


async def collect(stream: AsyncGenerator[StreamEvent | None, None], count: int) -> list[EventOut]:
    """The next `count` events (ticks skipped), or fail after WAIT_S."""
    got: list[EventOut] = []
    async with asyncio.timeout(WAIT_S):
        while len(got) < count:
            item = await anext(stream)
            if item is not None:
                assert item.json == item.event.model_dump_json()
                got.append(item.event)
    return got


async def drain(stream: AsyncGenerator[StreamEvent | None, None]) -> list[EventOut]:
    """Everything until the stream ends by itself (after task.finished)."""
    async with asyncio.timeout(WAIT_S):
        return [item.event async for item in stream if item is not None]


def seqs(items: list[EventOut]) -> list[int | None]:
    return [item.seq for item in items]


async def test_steps_landing_during_the_replay_arrive_once(
    sessions: Sessions, redis: Redis, hub: LiveHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REPLAY_BATCH", 2)  # the replay takes several queries
    task_id = await insert_task(sessions, status="running")
    for _ in range(5):
        await emit(sessions, redis, task_id)
    late = await emit(sessions, redis, task_id, publish=False)  # committed, published later

    async with open_stream(sessions, hub, "default", task_id, after=0) as opened:
        first = await collect(opened.events, 1)
        # Mid-replay: steps land (in Postgres for the later batches, and live), and the
        # late publish arrives; each must still come exactly once.
        await events.publish(redis, late)
        for _ in range(3):
            await emit(sessions, redis, task_id)
        rest = await collect(opened.events, 8)
        await emit(sessions, redis, task_id, events.TASK_FINISHED)
        tail = await drain(opened.events)

    assert seqs(first + rest + tail) == list(range(1, 11))
    assert tail[-1].type == events.TASK_FINISHED


async def test_a_step_committed_right_after_the_replay_query_comes_live(
    sessions: Sessions, redis: Redis
) -> None:
    # No idle ticks and nothing after it: only the live feed, joined before the
    # replay, can deliver it (no gap filling or Postgres catch-up to hide a miss).
    quiet = LiveHub(redis, tick_s=3600)
    task_id = await insert_task(sessions, status="running")
    for _ in range(3):
        await emit(sessions, redis, task_id)
    try:
        async with open_stream(sessions, quiet, "default", task_id, after=1) as opened:
            replayed = await collect(opened.events, 1)  # the whole replay was one query
            await emit(sessions, redis, task_id)
            rest = await collect(opened.events, 2)
    finally:
        await quiet.aclose()
    assert seqs(replayed + rest) == [2, 3, 4]


async def test_live_only_events_pass_between_durable_ones(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    task_id = await insert_task(sessions, status="running")
    await emit(sessions, redis, task_id)
    async with open_stream(sessions, hub, "default", task_id, after=0) as opened:
        await collect(opened.events, 1)
        await events.publish(redis, events.live_event(task_id, "tool.output", {"chunk": "a"}))
        await emit(sessions, redis, task_id)
        await events.publish(redis, events.live_event(task_id, "llm.delta", {"text": "b"}))
        await emit(sessions, redis, task_id, events.TASK_FINISHED)
        rest = await drain(opened.events)
    assert [(e.seq, e.type) for e in rest] == [
        (None, "tool.output"),
        (2, "step.started"),
        (None, "llm.delta"),
        (3, events.TASK_FINISHED),
    ]


async def live(redis: Redis, task_id: str, type_: str, **data: object) -> None:
    """What the worker publishes without storing it (a command's start, its output)."""
    await events.publish(redis, events.live_event(task_id, type_, data))


def shown(items: list[EventOut]) -> list[tuple[int | None, str, object]]:
    return [(e.seq, e.type, e.data.get("chunk")) for e in items]


async def running_step(sessions: Sessions, redis: Redis) -> str:
    """A task in its second step: a command started and printed "a"; the first step's
    output ("old") came before the newest durable event."""
    task_id = await insert_task(sessions, status="running")
    await emit(sessions, redis, task_id)  # seq 1
    await live(redis, task_id, "tool.output", chunk="old")
    await emit(sessions, redis, task_id, "step.completed")  # seq 2
    await emit(sessions, redis, task_id)  # seq 3
    await live(redis, task_id, "tool.started", tool="execute_bash")
    await live(redis, task_id, "tool.output", chunk="a")
    return task_id


IN_FLIGHT = [(None, "tool.started", None), (None, "tool.output", "a")]


async def test_a_viewer_from_the_start_gets_the_running_steps_live_events_so_far(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    """Live-only events are not stored: one who opens a running task after its command
    started still sees the command and its output so far, after the replay, once."""
    task_id = await running_step(sessions, redis)
    async with open_stream(sessions, hub, "default", task_id, after=0) as opened:
        first = await collect(opened.events, 5)
        await live(redis, task_id, "tool.output", chunk="b")
        await emit(sessions, redis, task_id, events.TASK_FINISHED)
        rest = await drain(opened.events)
    assert shown(first) == [
        (1, "step.started", None),
        (2, "step.completed", None),
        (3, "step.started", None),
        *IN_FLIGHT,
    ]
    assert shown(rest) == [(None, "tool.output", "b"), (4, events.TASK_FINISHED, None)]


async def test_a_second_viewer_of_a_followed_task_gets_them_too_and_a_resuming_one_not(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    """The second viewer joins the reader the first one started: it gets what came before
    it joined from the stream's past, and the rest live, each once. A viewer resuming at a
    seq had its chance at them (and could not tell them from new ones): none."""
    task_id = await running_step(sessions, redis)
    async with open_stream(sessions, hub, "default", task_id, after=0) as one:
        assert shown(await collect(one.events, 5))[3:] == IN_FLIGHT
        await live(redis, task_id, "tool.output", chunk="b")
        assert shown(await collect(one.events, 1)) == [(None, "tool.output", "b")]
        async with (
            open_stream(sessions, hub, "default", task_id, after=0) as two,
            open_stream(sessions, hub, "default", task_id, after=3) as resuming,
        ):
            assert hub.stats() == {"readers": 1, "viewers": 3}
            joined = await collect(two.events, 6)
            await live(redis, task_id, "tool.output", chunk="c")
            assert shown(await collect(two.events, 1)) == [(None, "tool.output", "c")]
            assert shown(await collect(resuming.events, 1)) == [(None, "tool.output", "c")]
            await emit(sessions, redis, task_id, events.TASK_FINISHED)
            rest_two = await drain(two.events)
            rest_resuming = await drain(resuming.events)
    assert shown(joined)[3:] == [*IN_FLIGHT, (None, "tool.output", "b")]
    assert shown(rest_two) == shown(rest_resuming) == [(4, events.TASK_FINISHED, None)]


async def test_a_gap_in_the_live_stream_is_filled_from_postgres(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    task_id = await insert_task(sessions, status="running")
    async with open_stream(sessions, hub, "default", task_id, after=0) as opened:
        await emit(sessions, redis, task_id, publish=False)  # seq 1: its publish was lost
        await emit(sessions, redis, task_id, publish=False)  # seq 2: lost too
        await emit(sessions, redis, task_id)  # seq 3 arrives live
        got = await collect(opened.events, 3)
    assert seqs(got) == [1, 2, 3]


async def test_a_lost_final_publish_is_caught_up_on_an_idle_tick(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    task_id = await insert_task(sessions, status="running")
    async with open_stream(sessions, hub, "default", task_id, after=0) as opened:
        await emit(sessions, redis, task_id, events.TASK_FINISHED, publish=False)
        got = await drain(opened.events)
    assert [(e.seq, e.type) for e in got] == [(1, events.TASK_FINISHED)]


async def test_resuming_at_every_point_of_a_finished_task_gives_exactly_the_rest(
    sessions: Sessions, redis: Redis, hub: LiveHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REPLAY_BATCH", 3)
    task_id = await insert_task(sessions, status="running")
    for _ in range(7):
        await emit(sessions, redis, task_id)
    await emit(sessions, redis, task_id, events.TASK_FINISHED)
    async with sessions.begin() as session:
        (await session.get_one(Task, task_id)).status = "succeeded"

    for after in range(9):
        async with open_stream(sessions, hub, "default", task_id, after=after) as opened:
            assert hub.stats()["readers"] == 0  # a finished task needs no live feed
            got = await drain(opened.events)
        assert seqs(got) == list(range(after + 1, 9)), after


async def test_unknown_and_foreign_tasks_are_not_found(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    foreign = await insert_task(sessions, tenant="someone-else", status="running")
    for task_id in ("tsk_nope", foreign):
        with pytest.raises(NotFound):
            async with open_stream(sessions, hub, "default", task_id):
                pass
    assert hub.stats() == {"readers": 0, "viewers": 0}


async def test_a_hundred_viewers_share_one_reader(
    sessions: Sessions, redis: Redis, hub: LiveHub
) -> None:
    task_id = await insert_task(sessions, status="running")
    async with contextlib.AsyncExitStack() as stack:
        subs = [await stack.enter_async_context(hub.subscribe(task_id)) for _ in range(100)]
        assert hub.stats() == {"readers": 1, "viewers": 100}
        for n in range(5):
            await events.publish(redis, events.live_event(task_id, "tool.output", {"n": n}))
        for sub in subs:
            got = []
            async with asyncio.timeout(WAIT_S):
                while len(got) < 5:
                    if (payload := await sub.next()) is not None:
                        got.append(EventOut.model_validate_json(payload).data["n"])
            assert got == [0, 1, 2, 3, 4]
    assert hub.stats() == {"readers": 0, "viewers": 0}


async def test_a_slow_viewer_is_cut_off_and_the_others_keep_up(
    sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running")
    small = LiveHub(redis, buffer=5, tick_s=60)
    try:
        async with small.subscribe(task_id) as slow, small.subscribe(task_id) as fast:
            seen: list[str | None] = []
            for n in range(20):
                await events.publish(redis, events.live_event(task_id, "tool.output", {"n": n}))
                async with asyncio.timeout(WAIT_S):
                    seen.append(await fast.next())
            assert len(seen) == 20
            assert slow.cut_off.is_set()
            with pytest.raises(SlowConsumer):
                await slow.next()
            # 5 buffered + the one that overflowed + the 14 published after the cut.
            assert small.losses() == {"slow_viewers": 1, "dropped_events": 20}
    finally:
        await small.aclose()


async def test_followers_get_durable_events_from_postgres_while_redis_is_down(
    sessions: Sessions,
) -> None:
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    dead_hub = LiveHub(dead, tick_s=TICK_S)
    task_id = await insert_task(sessions, status="running")
    try:
        async with open_stream(sessions, dead_hub, "default", task_id) as opened:
            await emit(sessions, dead, task_id, publish=False)
            await emit(sessions, dead, task_id, events.TASK_FINISHED, publish=False)
            got = await drain(opened.events)
    finally:
        await dead_hub.aclose()
        await dead.aclose()
    assert seqs(got) == [1, 2]


class SwallowsACancel(Redis):
    """Plays redis-py on Python 3.11 (gh-86296, app/kit/periodic.py): a cancel that lands
    during a read is lost, and the read returns as if it had found nothing."""

    reads = 0

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        try:
            return await super().xread(*args, **kwargs)
        except asyncio.CancelledError:
            return []


async def test_a_reader_that_lost_its_cancel_stops_once_its_last_viewer_left(
    sessions: Sessions, redis: Redis
) -> None:
    client = SwallowsACancel.from_url(REDIS_URL)
    swallowing_hub = LiveHub(client, tick_s=TICK_S)
    try:
        task_id = await insert_task(sessions, status="running")
        async with swallowing_hub.subscribe(task_id):
            await asyncio.sleep(TICK_S)  # the reader is in its blocking read
        reads_then = client.reads
        await asyncio.sleep(5 * TICK_S)
        assert client.reads == reads_then, "the reader polls a feed nobody holds"
    finally:
        await swallowing_hub.aclose()
        await client.aclose()
