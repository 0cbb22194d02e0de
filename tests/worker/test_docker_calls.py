"""Docker API calls per task, counted on the way to the real daemon (no mock: every call
still reaches dockerd and is answered by it), so that a change adding round trips to a
task's sandbox lifecycle shows up here rather than only as lost throughput in bench/.

The counter is tests/support/docker_calls.py. Worker-wide chores (readiness pings, the
reaper's listings) are left out: they run per interval, not per task.
"""

from __future__ import annotations

from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.schemas.tasks import InputFile, LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker
from tests.support.docker_calls import DockerCalls, docker_calls

__all__ = ["docker_calls"]
TASKS = 3
STEPS = 10
COLD_CALLS_PER_TASK = 4
"""create, start, the exec channel's exec create + start: inputs, commands and the output's
collection all go through the channel. The removal is one forced DELETE, counted apart
below because it runs off the task's critical path."""


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


async def run_tasks(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> list[str]:
    """TASKS tasks of STEPS steps (an input file, commands, an output file) to their end."""
    turns = [bash(f"echo {i} >> output/log.txt") for i in range(STEPS - 1)] + [Turn("submit")]
    scripted_llm.add_script("docker-calls", Script(turns=turns))
    ids = []
    for _ in range(TASKS):
        task = TaskCreate(
            prompt="work",
            llm=LLMOptions(model="docker-calls"),
            input_files=[InputFile(path="in.txt", content_base64="aGk=")],
        )
        ids.append(
            (await tasks.submit_task(sessions, redis, settings, "default", task, None))[0].id
        )
    await Worker(settings).run(burst=True)
    return [(await tasks.get_task(sessions, "default", task_id)).status for task_id in ids]


async def test_a_cold_task_costs_few_docker_calls(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    docker_calls: DockerCalls,
) -> None:
    settings = settings.model_copy(update={"warm_pool_size": 0, "worker_concurrency": 1})
    statuses = await run_tasks(settings, redis, sessions, scripted_llm)
    per_task = docker_calls.per_sandbox()
    removals = per_task.pop(("DELETE", "containers/{id}"), 0)
    assert statuses == ["succeeded"] * TASKS
    assert removals == TASKS, f"one forced DELETE per sandbox: {docker_calls.calls}"
    assert sum(per_task.values()) <= COLD_CALLS_PER_TASK * TASKS, (
        f"more Docker round trips per task than {COLD_CALLS_PER_TASK}: {dict(per_task)}"
    )


async def test_a_warm_task_costs_no_more_docker_calls(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    docker_calls: DockerCalls,
) -> None:
    """The pool's sandboxes are made with the same calls, ahead of need; the pool's last
    refill and its removal at close count too (one sandbox beyond the tasks')."""
    settings = settings.model_copy(update={"warm_pool_size": 1, "worker_concurrency": 1})
    statuses = await run_tasks(settings, redis, sessions, scripted_llm)
    per_task = docker_calls.per_sandbox()
    removals = per_task.pop(("DELETE", "containers/{id}"), 0)
    made = per_task[("POST", "containers/create")]
    assert statuses == ["succeeded"] * TASKS
    assert TASKS <= made <= TASKS + 1
    assert removals == made, f"every sandbox made is removed once: {docker_calls.calls}"
    assert sum(per_task.values()) <= COLD_CALLS_PER_TASK * made, dict(per_task)
