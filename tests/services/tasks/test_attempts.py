"""The worker's use cases on real Postgres and Redis: attempts, fencing, hand-back, lost workers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import event, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import undefer

from app.bus import live
from app.db import models
from app.db.engine import Sessions, create_engine, create_sessions
from app.ids import utc_now
from app.resources import Resources
from app.schemas.tasks import ActionOut, EventOut, StepOut, UsageOut
from app.services.events import event_out
from app.services.tasks import attempts
from app.services.tasks.attempts import StaleAttempt, StartedAttempt
from app.services.tasks.lifecycle import TaskEnd
from app.states import FinishReason
from tests.support.rows import insert_task


async def row(sessions: Sessions, task_id: str) -> models.Task:
    async with sessions() as session:
        return await session.get_one(models.Task, task_id)


async def event_types(sessions: Sessions, task_id: str) -> list[str]:
    async with sessions() as session:
        query = select(models.Event.type).where(models.Event.task_id == task_id)
        return list(await session.scalars(query.order_by(models.Event.seq)))


def step(attempt: int, index: int = 0) -> StepOut:
    return StepOut(
        index=index,
        attempt=attempt,
        thought="t",
        reasoning="",
        action=None,
        observation="o",
        exit_code=None,
        started_at=utc_now(),
        llm_ms=1,
        tool_ms=1,
        prompt_tokens=1,
        completion_tokens=1,
    )


async def start(
    sessions: Sessions, redis: Redis, task_id: str, max_attempts: int = 3
) -> StartedAttempt | None:
    return await attempts.start_attempt(sessions, redis, task_id, "w1", max_attempts=max_attempts)


async def test_a_stale_attempt_cannot_write(sessions: Sessions, redis: Redis) -> None:
    task_id = await insert_task(sessions)
    first = await start(sessions, redis, task_id)
    assert first is not None
    # Its worker "dies"; the task is reclaimed (still running) as attempt 2.
    second = await start(sessions, redis, task_id)
    assert second is not None
    assert (first.attempt, second.attempt) == (1, 2)

    with pytest.raises(StaleAttempt):
        await attempts.save_step(sessions, redis, task_id, step(attempt=1))
    with pytest.raises(StaleAttempt):
        await attempts.step_started(sessions, redis, task_id, 1, 0)
    with pytest.raises(StaleAttempt):
        await attempts.finish_task(
            sessions, redis, task_id, 1, TaskEnd(FinishReason.submitted), [("a.txt", b"old")]
        )
    with pytest.raises(StaleAttempt):
        await attempts.hand_back(sessions, redis, task_id, 1)

    await attempts.save_step(sessions, redis, task_id, step(attempt=2))
    await attempts.finish_task(
        sessions,
        redis,
        task_id,
        2,
        TaskEnd(FinishReason.submitted, answer="42", usage=UsageOut(steps=1)),
        [("a.txt", b"new")],
    )
    task = await row(sessions, task_id)
    assert (task.status, task.answer, task.attempt, task.lost_attempts) == ("succeeded", "42", 2, 1)
    async with sessions() as session:
        contents = list(await session.scalars(select(models.Artifact.content)))
    assert contents == [b"new"]
    # Finished: even the current attempt's late writes are refused.
    with pytest.raises(StaleAttempt):
        await attempts.save_step(sessions, redis, task_id, step(attempt=2, index=1))


async def test_after_max_lost_attempts_the_task_fails_worker_lost(
    sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions)
    assert await start(sessions, redis, task_id, max_attempts=2) is not None
    assert await start(sessions, redis, task_id, max_attempts=2) is not None  # 1 lost
    assert await start(sessions, redis, task_id, max_attempts=2) is None  # 2 lost: give up
    task = await row(sessions, task_id)
    assert (task.status, task.finish_reason) == ("failed", "worker_lost")
    assert "lost 2 times" in (task.error or "")
    assert (await event_types(sessions, task_id))[-1] == "task.finished"
    assert await start(sessions, redis, task_id) is None, "terminal: nothing to run"


async def test_hand_back_queues_the_task_without_losing_an_attempt(
    sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions)
    first = await start(sessions, redis, task_id, max_attempts=1)
    assert first is not None
    await attempts.hand_back(sessions, redis, task_id, first.attempt)
    task = await row(sessions, task_id)
    assert (task.status, task.lost_attempts) == ("queued", 0)
    second = await start(sessions, redis, task_id, max_attempts=1)
    assert second is not None, "a handed-back attempt does not count against the limit"
    assert second.attempt == 2
    assert await event_types(sessions, task_id) == ["task.started", "task.queued", "task.started"]


async def test_a_cancel_recorded_before_the_start_ends_the_task(
    sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running", attempt=1)
    async with sessions.begin() as session:
        task = await session.get_one(models.Task, task_id)
        task.cancel_requested_at = utc_now()
    assert await start(sessions, redis, task_id) is None
    task = await row(sessions, task_id)
    assert (task.status, task.finish_reason, task.attempt) == ("cancelled", "cancelled", 1)


async def test_housekeeping_reads(sessions: Sessions, redis: Redis) -> None:
    old = utc_now() - timedelta(minutes=5)
    queued = await insert_task(sessions, created_at=old)
    running = await insert_task(sessions, status="running", attempt=2, created_at=old)
    await insert_task(sessions, status="succeeded", created_at=old)
    young = await insert_task(sessions)
    found = await attempts.unfinished_tasks(sessions, utc_now() - timedelta(seconds=5))
    assert found == {queued: "queued", running: "running"}
    assert young not in found
    assert await attempts.task_states(sessions, [running, "tsk_nope"]) == {running: ("running", 2)}
    assert await attempts.cancel_requested(sessions, [queued, running]) == set()


async def test_a_step_and_the_next_start_are_one_statement(res: Resources, redis: Redis) -> None:
    sessions = res.sessions
    statements: list[str] = []
    event.listen(
        res.engine.sync_engine,
        "before_cursor_execute",
        lambda _conn, _cursor, sql, *_: statements.append(sql),
    )
    task_id = await insert_task(sessions)
    started = await start(sessions, redis, task_id)
    assert started is not None
    await attempts.step_started(sessions, redis, task_id, 1, 0)
    before = len(statements)
    await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=0), next_index=1)
    assert len(statements) - before == 1
    await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=1))
    assert len(statements) - before == 2
    types = await event_types(sessions, task_id)
    # A newer attempt fences the combined write off whole: no half of it lands.
    assert await start(sessions, redis, task_id) is not None
    with pytest.raises(StaleAttempt):
        await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=2), 3)
    after = await event_types(sessions, task_id)
    assert types == [
        "task.started",
        "step.started",
        "step.completed",
        "step.started",
        "step.completed",
    ]
    assert after == [*types, "task.started"]
    async with sessions() as session:
        stored = await session.scalars(
            select(models.Step.index).where(models.Step.task_id == task_id)
        )
        assert sorted(stored) == [0, 1]
        seqs = await session.scalars(
            select(models.Event.seq).where(models.Event.task_id == task_id)
        )
        assert sorted(seqs) == list(range(1, len(after) + 1))  # no seq taken by the fenced one


async def test_a_stored_step_keeps_every_field(sessions: Sessions, redis: Redis) -> None:
    """The one-statement store (`step_rows`) writes each column as the step had it: text
    with NUL made storable, the action as JSON, the capture and message with their keys in
    the order sent, the times and counts; its event carries the same step."""
    task_id = await insert_task(sessions)
    assert await start(sessions, redis, task_id) is not None
    started = utc_now() - timedelta(seconds=3)
    done = StepOut(
        index=0,
        attempt=1,
        thought="think\x00ing",
        reasoning="why",
        action=ActionOut(tool="execute_bash", arguments={"command": "printf 'a\\0b'"}),
        observation="a\x00b",
        exit_code=3,
        started_at=started,
        llm_ms=12,
        tool_ms=34,
        prompt_tokens=56,
        completion_tokens=78,
        interrupted="timeout",
    )
    message = {"role": "assistant", "content": "c\x00", "b": 1, "a": 2}
    capture = {"z": [1, 2], "a": {"y": "\x00", "b": None}}
    await attempts.save_step(sessions, redis, task_id, done, capture=capture, message=message)
    async with sessions() as session:
        stored = await session.scalar(
            select(models.Step)
            .where(models.Step.task_id == task_id)
            .options(undefer(models.Step.capture_json), undefer(models.Step.message))
        )
        completed = await session.scalar(
            select(models.Event.data).where(
                models.Event.task_id == task_id, models.Event.type == "step.completed"
            )
        )
    assert stored is not None
    assert (stored.attempt, stored.index, stored.thought, stored.reasoning) == (
        1,
        0,
        "think\ufffding",
        "why",
    )
    assert stored.action == {"tool": "execute_bash", "arguments": {"command": "printf 'a\\0b'"}}
    assert (stored.observation, stored.exit_code, stored.interrupted) == ("a\ufffdb", 3, "timeout")
    assert stored.started_at == started
    assert (stored.llm_ms, stored.tool_ms, stored.prompt_tokens, stored.completion_tokens) == (
        12,
        34,
        56,
        78,
    )
    assert list(stored.message or {}) == ["role", "content", "b", "a"]
    assert stored.message == {"role": "assistant", "content": "c\ufffd", "b": 1, "a": 2}
    assert stored.capture_json == {"z": [1, 2], "a": {"y": "\ufffd", "b": None}}
    assert list((stored.capture_json or {})["a"]) == ["y", "b"]
    assert completed is not None
    assert completed["observation"] == "a\ufffdb"
    assert completed["action"]["tool"] == "execute_bash"
    assert completed["started_at"] == done.model_dump(mode="json")["started_at"]
    async with sessions() as session:
        rows = await session.scalars(
            select(models.Event).where(models.Event.task_id == task_id).order_by(models.Event.seq)
        )
        stored_events = [event_out(row) for row in rows]
    published = [
        EventOut.model_validate_json(payload)
        for _, payload in await live.read_after(redis, task_id, "0-0", block_ms=0)
    ]
    assert published == stored_events  # seq, type, ts and data: what was committed
    assert [e.type for e in published] == ["task.started", "step.completed"]


async def test_missing_json_is_json_null_and_odd_numbers_are_stored(
    clean_db: str, redis: Redis
) -> None:
    """As the ORM's JSON columns stored them: no action, capture or message is JSON `null`
    (not SQL NULL); a NaN in a tool's arguments (Python's json.loads takes one) is `null`,
    as in the event. A pool of one shows the autocommit connection handed back in its
    usual isolation, so a later transaction is one."""
    engine = create_engine(clean_db, pool_size=1)
    sessions = create_sessions(engine)
    try:
        task_id = await insert_task(sessions)
        assert await start(sessions, redis, task_id) is not None
        await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=0), 1)
        nan = step(attempt=1, index=1).model_copy(
            update={"action": ActionOut(tool="execute_bash", arguments={"x": float("nan")})}
        )
        await attempts.save_step(sessions, redis, task_id, nan)
        async with sessions() as session:
            found = await session.execute(
                text(
                    "SELECT index, action IS NULL, jsonb_typeof(action), message IS NULL,"
                    " json_typeof(message), capture_json IS NULL, action->'arguments'"
                    " FROM steps WHERE task_id = :id ORDER BY index"
                ),
                {"id": task_id},
            )
            rows = [tuple(row) for row in found]
            conn = await session.connection()
            assert await conn.get_isolation_level() == "READ COMMITTED"
    finally:
        await engine.dispose()
    assert rows == [
        (0, False, "null", False, "null", False, None),
        (1, False, "object", False, "null", False, {"x": None}),
    ]


async def test_a_step_stored_twice_is_refused_whole(sessions: Sessions, redis: Redis) -> None:
    task_id = await insert_task(sessions)
    assert await start(sessions, redis, task_id) is not None
    await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=0), 1)
    before = (await row(sessions, task_id)).last_seq
    with pytest.raises(IntegrityError):
        await attempts.save_step(sessions, redis, task_id, step(attempt=1, index=0), 1)
    assert (await row(sessions, task_id)).last_seq == before  # no seq taken, no event
    assert await event_types(sessions, task_id) == [
        "task.started",
        "step.completed",
        "step.started",
    ]


async def age_attempt(sessions: Sessions, task_id: str, attempt: int, ago: timedelta) -> None:
    """Move an attempt's `task.started` event `ago` into the past, as if it started then."""
    async with sessions.begin() as session:
        found = await session.scalars(
            select(models.Event).where(
                models.Event.task_id == task_id, models.Event.type == "task.started"
            )
        )
        for started in found:
            if started.data.get("attempt") == attempt:
                started.ts = utc_now() - ago
        if attempt == 1:
            task = await session.get_one(models.Task, task_id)
            task.started_at = utc_now() - ago


async def test_time_between_attempts_is_not_the_agents(sessions: Sessions, redis: Redis) -> None:
    """An attempt ran 30 s of its 60 s, then its worker was lost; the next attempt starts
    an hour later. It gets the 30 s left, not a `timeout` for the hour nobody ran it."""
    task_id = await insert_task(sessions)
    async with sessions.begin() as session:
        task = await session.get_one(models.Task, task_id)
        task.spec = {**task.spec, "limits": {**task.spec["limits"], "timeout_s": 60}}
    first = await start(sessions, redis, task_id)
    assert first is not None
    assert first.used_s == 0.0
    await age_attempt(sessions, task_id, 1, timedelta(hours=1))
    long_ago = step(1).model_copy(
        update={"started_at": utc_now() - timedelta(hours=1) + timedelta(seconds=20)}
    )
    await attempts.save_step(
        sessions, redis, task_id, long_ago.model_copy(update={"llm_ms": 6000, "tool_ms": 4000})
    )
    second = await start(sessions, redis, task_id)  # the first one's worker was lost
    assert second is not None, "not ended as timeout: the hour between was nobody's"
    assert second.used_s == pytest.approx(30.0, abs=0.5)
    await age_attempt(sessions, task_id, 2, timedelta(hours=1))
    at_the_end = step(2).model_copy(
        update={"started_at": utc_now() - timedelta(hours=1) + timedelta(seconds=29)}
    )
    await attempts.save_step(
        sessions, redis, task_id, at_the_end.model_copy(update={"llm_ms": 1000})
    )
    assert await start(sessions, redis, task_id) is None, "30 + 30 s: its timeout is spent"
    task = await row(sessions, task_id)
    assert (task.status, task.finish_reason) == ("failed", "timeout")
