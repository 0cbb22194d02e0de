"""The worker pool in-process (burst mode): real Postgres, Redis, Docker and the scripted LLM."""

from __future__ import annotations

from redis.asyncio import Redis

from app.bus import keys, queue
from app.config import Settings
from app.db.engine import Sessions
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker


def one_step(model: str) -> TaskCreate:
    return TaskCreate(prompt="compute", llm=LLMOptions(model=model))


async def test_burst_runs_everything_once_and_returns(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script("pool-once", Script(turns=[Turn(tool="submit", arguments={})]))
    ids = [
        (
            await tasks.submit_task(
                sessions, redis, settings, "default", one_step("pool-once"), None
            )
        )[0].id
        for _ in range(3)
    ]
    await queue.enqueue(redis, ids[0])  # a duplicate message (e.g. from reconciliation)
    await Worker(settings).run(burst=True)
    done = [await tasks.get_task(sessions, "default", task_id) for task_id in ids]
    assert [(t.status, t.attempt) for t in done] == [("succeeded", 1)] * 3
    assert scripted_llm.requests["pool-once"] == 3, "the duplicate message ran nothing"
    assert await queue.queued_task_ids(redis) == set()
    assert (await redis.xpending(keys.TASK_STREAM, keys.WORKER_GROUP))["pending"] == 0
    assert await redis.keys(keys.task_lease("*")) == [], "every lease released"
    assert await redis.keys(keys.worker_heartbeat("*")) == [], "a clean exit forgets the worker"
