"""The synchronous client against a real Sandhive: submit, wait, stream, artifacts, errors.

Every call goes over HTTP to `sandhive serve`, a `sandhive worker` runs the task
in Docker with the scripted model; what the client returns is checked against
what the server stored.
"""

from __future__ import annotations

import io
import uuid
import zipfile

import pytest
from sandhive_client import Conflict, InvalidInput, NotFound, Sandhive

from app.scripted import Script, ScriptedLLMServer, Turn
from tests.client.conftest import ANSWER, STEPS, slow_answer_script
from tests.client.proxy import CuttableProxy
from tests.e2e.fault_harness import Cluster, db_events


def model(llm: ScriptedLLMServer, script: Script) -> str:
    name = f"client-{uuid.uuid4().hex[:8]}"
    llm.add_script(name, script)
    return name


def test_submit_wait_trajectory_and_artifacts(
    live: Cluster, scripted_llm: ScriptedLLMServer
) -> None:
    name = model(scripted_llm, slow_answer_script(delay_s=0))
    with Sandhive(live.base_url) as client:
        task = client.tasks.create("sum the squares", llm={"model": name}, metadata={"ticket": 7})
        assert (task.status, task.metadata) == ("queued", {"ticket": 7})
        done = client.tasks.wait(task.id, timeout_s=120, poll_s=0.3)
        assert (done.status, done.finish_reason, done.answer) == ("succeeded", "submitted", ANSWER)
        assert done.usage.steps == STEPS + 2
        assert client.tasks.get(task.id).answer == ANSWER
        assert task.id in [t.id for t in client.tasks.list(limit=10).items]

        steps = client.tasks.trajectory(task.id).steps
        assert [s.action["tool"] for s in steps if s.action] == [
            *["execute_bash"] * STEPS,
            "str_replace_editor",
            "submit",
        ]
        assert "step 0" in (steps[0].observation or "")

        listed = client.tasks.artifacts.list(task.id)
        assert [(a.path, a.size) for a in listed.items] == [("answer.txt", len(ANSWER))]
        assert client.tasks.artifacts.download(task.id, "answer.txt") == ANSWER.encode()
        archive = zipfile.ZipFile(io.BytesIO(client.tasks.artifacts.zip(task.id)))
        assert archive.read("answer.txt") == ANSWER.encode()


def test_fork_replays_a_task_from_a_step(live: Cluster, scripted_llm: ScriptedLLMServer) -> None:
    name = model(scripted_llm, slow_answer_script(delay_s=0))
    with Sandhive(live.base_url) as client:
        parent = client.tasks.wait(client.tasks.create("fork me", llm={"model": name}).id)
        forked = client.tasks.fork(parent.id, 2, n=2)
        assert (forked.parent_id, forked.step, len(forked.tasks)) == (parent.id, 2, 2)
        recorded = [s.observation for s in client.tasks.trajectory(parent.id).steps]
        for child in forked.tasks:
            assert child.fork is not None
            assert (child.fork["parent_id"], child.fork["step"]) == (parent.id, 2)
            done = client.tasks.wait(child.id, timeout_s=120, poll_s=0.3)
            assert (done.status, done.answer) == ("succeeded", ANSWER)
            replayed = [s.observation for s in client.tasks.trajectory(child.id).steps]
            assert replayed == recorded  # the same script: replayed, then the same steps
        with pytest.raises(NotFound):
            client.tasks.fork(parent.id, 99)


def test_stream_survives_a_dropped_connection_without_losing_or_repeating(
    live: Cluster, scripted_llm: ScriptedLLMServer
) -> None:
    name = model(scripted_llm, slow_answer_script(delay_s=0.5))
    with CuttableProxy(live.port) as proxy, Sandhive(proxy.url) as client:
        task = client.tasks.create("sum the squares", llm={"model": name})
        seen = []
        for event in client.tasks.stream(task.id):
            seen.append(event)
            if event.seq == 3:
                proxy.cut()  # mid-task: the stream's connection dies under the client
        assert proxy.connections >= 2  # it did reconnect
    durable = [e for e in seen if e.seq is not None]
    stored = db_events(live.settings.database_url, task.id)
    assert [e.seq for e in durable] == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert [e.type for e in durable] == [e["type"] for e in stored]
    assert durable[-1].type == "task.finished"
    assert durable[-1].data["status"] == "succeeded"
    assert len(stored) > 3  # the cut was not at the end
    # Resuming by seq on purpose: only what came after.
    with Sandhive(live.base_url) as client:
        assert [e.seq for e in client.tasks.stream(task.id, after=len(stored) - 2)] == [
            len(stored) - 1,
            len(stored),
        ]
        assert list(client.tasks.stream(task.id, after=len(stored))) == []


def test_errors_are_typed_and_carry_the_error_shape(
    live: Cluster, scripted_llm: ScriptedLLMServer
) -> None:
    with Sandhive(live.base_url) as client:
        with pytest.raises(InvalidInput) as invalid:
            client.tasks.create("x", limits={"max_steps": 10**6})
        assert (invalid.value.status, invalid.value.code) == (422, "invalid_input")
        assert invalid.value.message.startswith("limits.max_steps: ")
        assert invalid.value.details[0]["loc"] == ["body", "limits", "max_steps"]
        with pytest.raises(NotFound) as missing:
            client.tasks.get("tsk_nope")
        assert missing.value.code == "not_found"

        name = model(scripted_llm, Script(turns=[Turn(tool="submit", arguments={})]))
        task = client.tasks.create("x", llm={"model": name})
        client.tasks.wait(task.id, timeout_s=120, poll_s=0.3)
        with pytest.raises(Conflict):
            client.tasks.cancel(task.id)


def test_create_is_idempotent_and_batches_are_all_or_nothing(live: Cluster) -> None:
    with Sandhive(live.base_url) as client:
        first = client.tasks.create("x", idempotency_key="order-1", limits={"max_steps": 1})
        again = client.tasks.create("x", idempotency_key="order-1", limits={"max_steps": 1})
        assert again.id == first.id
        assert client.tasks.create("x").id != client.tasks.create("x").id  # a new key each

        with pytest.raises(InvalidInput) as invalid:
            client.tasks.create_batch(
                [{"prompt": "a"}, {"prompt": "b", "limits": {"max_steps": 0}}]
            )
        assert invalid.value.message.startswith("tasks.1.limits.max_steps: ")
        before = len(client.tasks.list(limit=100).items)

        batch = client.tasks.create_batch(
            [
                {"prompt": "a"},
                {"prompt": "x", "idempotency_key": "order-1", "limits": {"max_steps": 1}},
            ]
        )
        assert [t.prompt for t in batch.tasks] == ["a", "x"]
        assert batch.tasks[1].id == first.id
        assert batch.created == [True, False]
        assert len(client.tasks.list(limit=100).items) == before + 1
