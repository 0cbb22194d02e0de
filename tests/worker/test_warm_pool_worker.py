"""A worker with `warm_pool_size` runs its tasks in pooled sandboxes and leaves none behind."""

from __future__ import annotations

from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.metrics import REGISTRY
from app.sandbox.docker import DockerHost
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker

# Seconds since the sandbox's first process started, written as the task's answer.
AGE = (
    "python3 -c \"import os; up = float(open('/proc/uptime').read().split()[0]); "
    "start = int(open('/proc/1/stat').read().split()[21]) / os.sysconf('SC_CLK_TCK'); "
    'print(round(up - start, 1))" > output/answer.txt'
)


def started_from() -> dict[str, float]:
    """Sandboxes handed to tasks so far by source (`sandhive_worker_sandbox_start_seconds`)."""
    name = "sandhive_worker_sandbox_start_seconds_count"
    return {
        source: REGISTRY.get_sample_value(name, {"source": source}) or 0.0
        for source in ("cold", "warm")
    }


async def test_second_task_gets_a_sandbox_started_before_it(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    slow = [Turn(tool="execute_bash", arguments={"command": AGE}), Turn("submit", delay_s=3.0)]
    scripted_llm.add_script("warm-first", Script(turns=slow))
    fast = [Turn(tool="execute_bash", arguments={"command": AGE}), Turn("submit")]
    scripted_llm.add_script("warm-second", Script(turns=fast))
    config = settings.model_copy(update={"warm_pool_size": 1, "worker_concurrency": 1})
    before = started_from()
    ids = []
    for model in ("warm-first", "warm-second"):
        task = TaskCreate(prompt="age", llm=LLMOptions(model=model))
        created = await tasks.submit_task(sessions, redis, config, "default", task, None)
        ids.append(created[0].id)
    await Worker(config).run(burst=True)
    done = [await tasks.get_task(sessions, "default", task_id) for task_id in ids]
    assert [t.status for t in done] == ["succeeded", "succeeded"]
    first_age, second_age = (float(t.answer or "nan") for t in done)
    assert first_age < 2.5, "the first task of a shape starts cold"
    assert second_age >= 1.0, "the second got the sandbox pooled while the first ran"
    after = started_from()
    assert (after["cold"] - before["cold"], after["warm"] - before["warm"]) == (1, 1)
    async with DockerHost() as host:
        left = await host.list_sandboxes({"sandhive.instance": config.instance_name()})
    assert left == [], "the pool is removed when the worker stops"
