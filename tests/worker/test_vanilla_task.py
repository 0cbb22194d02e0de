"""A vanilla task through the whole path: submitted, run by a burst-mode worker, stored."""

from __future__ import annotations

import asyncio
import subprocess

from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.sandbox.reaper import TASK_LABEL
from app.schemas.tasks import InputFile, LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker


async def test_a_submitted_vanilla_task_succeeds_with_the_response_as_its_answer(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(
        "worker-vanilla", Script([Turn(content="Answer: 42", reasoning="hmm")], tools="none")
    )
    body = TaskCreate(
        prompt="What is 6 * 7?",
        mode="vanilla",
        llm=LLMOptions(model="worker-vanilla"),
        input_files=[InputFile(path="notes.txt", content_base64="c2l4IHRpbWVzIHNldmVu")],
    )
    task, _ = await tasks.submit_task(sessions, redis, settings, "default", body, None)
    await Worker(settings).run(burst=True)

    done = await tasks.get_task(sessions, "default", task.id)
    assert (done.status, done.finish_reason, done.answer) == (
        "succeeded",
        "submitted",
        "Answer: 42",
    )
    assert (done.usage.steps, done.usage.sandbox_seconds) == (1, 0)
    assert done.usage.prompt_tokens > 0
    assert done.prompt_config == "vanilla"
    [step] = (await tasks.get_trajectory(sessions, "default", task.id)).steps
    assert (step.thought, step.reasoning, step.action, step.observation) == (
        "Answer: 42",
        "hmm",
        None,
        "",
    )
    assert scripted_llm.requests["worker-vanilla"] == 1
    assert [f for f in scripted_llm.failures if f.startswith("worker-vanilla")] == []
    [message] = (scripted_llm.last_request("worker-vanilla") or {})["messages"]
    assert "BEGIN DOCUMENT 1:\nsix times seven\nEND DOCUMENT 1" in message["content"]
    listed = await asyncio.to_thread(containers_of, task.id)
    assert listed == [], "no sandbox was created for it"


def containers_of(task_id: str) -> list[str]:
    ps = subprocess.run(
        ["docker", "ps", "-aq", f"--filter=label={TASK_LABEL}={task_id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return ps.stdout.split()
