"""The asyncio client against a real Sandhive: a stream across an API restart, experiments."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sandhive_client import AsyncSandhive, Event, InvalidInput, NotFound

from app.scripted import ScriptedLLMServer
from tests.client.conftest import ANSWER, slow_answer_script
from tests.e2e.fault_harness import Cluster, db_events
from tests.support.experiments import scripted


async def test_stream_resumes_across_an_api_restart(
    live: Cluster, scripted_llm: ScriptedLLMServer
) -> None:
    name = f"client-async-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(name, slow_answer_script(delay_s=0.5))
    async with AsyncSandhive(live.base_url) as client:
        task = await client.tasks.create("sum the squares", llm={"model": name})
        seen: list[Event] = []
        restarted = False
        async for event in client.tasks.stream(task.id):
            seen.append(event)
            if event.seq == 3 and not restarted:
                assert live.api is not None
                live.api.kill()  # SIGKILL: the stream's connection breaks, no goodbye
                live.api.wait()
                await asyncio.to_thread(live.start_api)  # same port
                restarted = True
        assert restarted
        done = await client.tasks.wait(task.id, timeout_s=60, poll_s=0.3)
        assert (done.status, done.answer) == ("succeeded", ANSWER)
        listed = await client.tasks.artifacts.list(task.id)
        assert [a.path for a in listed.items] == ["answer.txt"]
        assert await client.tasks.artifacts.download(task.id, "answer.txt") == ANSWER.encode()
    durable = [e.seq for e in seen if e.seq is not None]
    stored = await asyncio.to_thread(db_events, live.settings.database_url, task.id)
    assert durable == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert seen[-1].type == "task.finished"


async def test_experiments_and_errors(live: Cluster, scripted_llm: ScriptedLLMServer) -> None:
    vanilla = scripted(scripted_llm, "client-exp", "The answer is \\boxed{4}.")
    spec = {
        "name": "client sums",
        "dataset": {"rows": [{"id": "q", "problem_statement": "2 + 2?", "ground_truth": "4"}]},
        "arms": [{"name": "v", "mode": "vanilla", "task": {"llm": {"model": vanilla}}}],
        "scorer": {"kind": "math"},
    }
    async with AsyncSandhive(live.base_url) as client:
        exp = await client.experiments.create(spec)
        assert exp.name == "client sums"
        assert exp.id in [e.id for e in (await client.experiments.list()).experiments]
        for _ in range(300):
            exp = await client.experiments.get(exp.id)
            if exp.status == "finished":
                break
            await asyncio.sleep(0.2)
        assert exp.status == "finished"
        items = await client.experiments.items(exp.id)
        assert [(i.row_id, i.arm, i.status, i.score) for i in items] == [("q", "v", "scored", 1.0)]
        results = await client.experiments.results(exp.id)
        assert [(a["arm"], a["n"], a["mean"]) for a in results["arms"]] == [("v", 1, 1.0)]
        package = await client.experiments.results(exp.id, format="package")
        assert package, "the package's results.json shape per arm"
        with pytest.raises(InvalidInput) as invalid:
            await client.experiments.create({**spec, "arms": []})
        assert invalid.value.code == "invalid_input"
        with pytest.raises(NotFound):
            await client.experiments.cancel("exp_nope")
