"""Forking a task from one of its steps by replay (`POST /v1/tasks/{id}/fork`), run by a real
worker in real sandboxes with the scripted model.

A child replays the parent's steps before the branch in a fresh sandbox, so its files are
as they were after that step, whatever the parent did later; its model is first asked
with exactly the messages the parent's model got at that step; children do not share a
sandbox; a replayed command whose answer differs from the record (it prints the time)
stops the child at that step, or is recorded where the caller allowed it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import select

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from app.db.models import StepSnapshot
from app.schemas.tasks import LLMOptions, SandboxRequest, TaskCreate, TaskForkIn, TaskOut
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import forks as task_forks
from app.services.tasks import service as tasks
from app.services.tasks import snapshots
from app.worker.pool import Worker
from tests.api.conftest import serve

FILE = "/testbed/notes.txt"


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


SUBMIT = Turn(tool="submit")


def after(replayed: int, *turns: Turn) -> Script:
    """A child's script: the scripted model picks a turn by the assistant messages already
    in the history, so a child's first call, after `replayed` steps, plays turn `replayed`."""
    unused = Turn(content="never played: these steps are replayed, not asked")
    return Script([*[unused] * replayed, *turns])


async def submit_parent(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    model: str,
    turns: list[Turn],
    *,
    snapshots: bool = False,
) -> TaskOut:
    """A queued parent task playing `turns` (storing step snapshots with `snapshots`)."""
    scripted_llm.add_script(model, Script(turns))
    sandbox = SandboxRequest(snapshots="steps" if snapshots else "off")
    body = TaskCreate(prompt="fork me", llm=LLMOptions(model=model), sandbox=sandbox)
    task, _ = await tasks.submit_task(sessions, redis, settings, "default", body, None)
    return task


async def run_parent(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    model: str,
    turns: list[Turn],
    *,
    snapshots: bool = False,
) -> TaskOut:
    """The parent, run to its end by a worker (it must submit)."""
    task = await submit_parent(
        settings, redis, sessions, scripted_llm, model, turns, snapshots=snapshots
    )
    await Worker(settings).run(burst=True)
    done = await tasks.get_task(sessions, "default", task.id)
    assert done.finish_reason == "submitted", done.error
    return done


async def fork(
    settings: Settings, redis: Redis, sessions: Sessions, parent: TaskOut, **body: Any
) -> list[TaskOut]:
    forked = await task_forks.fork_task(
        sessions, redis, settings, "default", parent.id, TaskForkIn(**body)
    )
    await Worker(settings).run(burst=True)
    return [await tasks.get_task(sessions, "default", child.id) for child in forked.tasks]


async def observations(sessions: Sessions, task_id: str) -> list[str]:
    trajectory = await tasks.get_trajectory(sessions, "default", task_id)
    return [step.observation for step in trajectory.steps]


def stdout(observation: str) -> str:
    return observation.split("[STDOUT]\n", 1)[1] if "[STDOUT]\n" in observation else ""


async def test_a_child_has_the_files_of_its_branch_step_and_its_own_sandbox(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-files-parent",
        [
            bash("echo one > /tmp/scratch.txt"),
            bash("mkdir -p /testbed/work && echo two > /testbed/work/two.txt"),
            bash(f"echo after-3 > {FILE}"),
            bash(f"cat {FILE}"),
            bash(f"echo after-5 > {FILE}"),
            SUBMIT,
        ],
    )
    look = bash(f"cat {FILE} /tmp/scratch.txt /testbed/work/two.txt; echo mine >> {FILE}")
    scripted_llm.add_script("fork-files-child", after(3, look, SUBMIT))
    children = await fork(
        settings, redis, sessions, parent, step=3, n=2, llm={"model": "fork-files-child"}
    )
    for child in children:
        assert child.status == "succeeded", child.error
        assert child.fork is not None
        assert (child.fork.parent_id, child.fork.step, child.fork.diverged) == (parent.id, 3, None)
        seen = await observations(sessions, child.id)
        assert seen[:3] == (await observations(sessions, parent.id))[:3]  # replayed as recorded
        # As after step 3: not the parent's later write, and not the sibling's.
        assert stdout(seen[3]) == "after-3\none\ntwo\n"
        assert child.usage.steps == 5


async def test_the_childs_model_gets_exactly_the_parents_messages_at_the_branch(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-exact-parent",
        [
            bash("echo x > /testbed/x.txt"),
            Turn(
                tool="str_replace_editor",
                arguments='{"command":"view","path":"/testbed/x.txt"}',  # as sent, not re-dumped
                content="Let me look.",
            ),
            bash("ls /testbed"),  # names only: a listing with times would diverge
            SUBMIT,
        ],
    )
    at_branch = scripted_llm.last_request("fork-exact-parent")  # its 4th call: step 3
    assert at_branch is not None
    scripted_llm.add_script("fork-exact-child", after(3, SUBMIT))
    [child] = await fork(
        settings, redis, sessions, parent, step=3, llm={"model": "fork-exact-child"}
    )
    assert child.status == "succeeded", child.error
    first = scripted_llm.last_request("fork-exact-child")
    assert first is not None
    assert scripted_llm.requests["fork-exact-child"] == 1
    assert json.dumps(first["messages"]) == json.dumps(at_branch["messages"])
    assert json.dumps(first["tools"]) == json.dumps(at_branch["tools"])


async def test_a_replay_that_diverges_stops_at_that_step_or_records_it(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-diverge-parent",
        [bash("echo same"), bash("date +%s%N"), bash("echo after"), SUBMIT],
    )
    scripted_llm.add_script("fork-diverge-child", after(3, SUBMIT))
    [stopped] = await fork(
        settings, redis, sessions, parent, step=3, llm={"model": "fork-diverge-child"}
    )
    assert (stopped.status, stopped.finish_reason) == ("failed", "replay_diverged")
    assert stopped.error is not None
    assert "diverged at step 1" in stopped.error
    assert "+" in stopped.error  # the diff's replayed side
    assert scripted_llm.requests.get("fork-diverge-child", 0) == 0  # never asked

    [allowed] = await fork(
        settings,
        redis,
        sessions,
        parent,
        step=3,
        allow_divergence=True,
        llm={"model": "fork-diverge-child"},
    )
    assert allowed.status == "succeeded", allowed.error
    assert allowed.fork is not None
    assert allowed.fork.diverged is not None
    assert allowed.fork.diverged["step"] == 1
    assert allowed.fork.diverged["expected"] != allowed.fork.diverged["got"]


async def test_forks_refused_with_what_is_wrong(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-refused-parent",
        [bash("echo a"), SUBMIT],
    )
    async with serve(create_app(settings)) as api:
        url = f"/v1/tasks/{parent.id}/fork"
        missing = await api.post(url, json={"step": 5})
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["details"] == {"completed_steps": 2}
        after_submit = await api.post(url, json={"step": 2})
        assert after_submit.status_code == 409, after_submit.text
        assert "submitted" in after_submit.json()["error"]["message"]
        too_many = await api.post(url, json={"step": 1, "n": 65})
        assert too_many.status_code == 422, too_many.text
        no_room = await api.post(url, json={"step": 1, "limits": {"max_steps": 1}})
        assert no_room.status_code == 422, no_room.text
        unknown = await api.post("/v1/tasks/tsk_nope/fork", json={"step": 0})
        assert unknown.status_code == 404, unknown.text
        ok = await api.post(url, json={"step": 1, "n": 2})
        assert ok.status_code == 202, ok.text
        assert [t["fork"]["parent_id"] for t in ok.json()["tasks"]] == [parent.id] * 2
    listed = await tasks.list_tasks(sessions, "default")
    assert len(listed.items) == 3  # the refusals wrote nothing


async def test_steps_stored_otherwise_than_sent_replay_as_recorded(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    """A call whose arguments are not JSON (its history copy repaired to `{}`, its answer
    the loop's complaint) and a command printing a NUL (stored as U+FFFD) replay without
    diverging."""
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-odd-parent",
        [
            Turn(tool="execute_bash", arguments='{"command": "echo cut off'),
            bash("printf 'a\\000b'"),
            bash("echo fine"),
            SUBMIT,
        ],
    )
    recorded = await observations(sessions, parent.id)
    assert "\ufffd" in recorded[1]
    scripted_llm.add_script("fork-odd-child", after(3, SUBMIT))
    [child] = await fork(settings, redis, sessions, parent, step=3, llm={"model": "fork-odd-child"})
    assert child.status == "succeeded", child.error
    assert (await observations(sessions, child.id))[:3] == recorded[:3]


async def test_a_fork_from_a_snapshot_runs_nothing_again(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    """The child's files are the parent's after the step before the branch (a time it wrote
    is the same, a later change is not there), nothing is run again, and its model gets
    exactly the messages the parent's got at that step."""
    parent = await run_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-snap-parent",
        [
            bash("date +%s%N > /testbed/output/answer.txt"),
            bash("cat /testbed/output/answer.txt"),
            bash("echo changed > /testbed/output/answer.txt"),
            SUBMIT,
        ],
        snapshots=True,
    )
    assert (parent.status, parent.answer) == ("succeeded", "changed\n"), parent.error
    assert parent.sandbox.snapshots == "steps"
    async with sessions() as session:
        stored = {
            row.index: (row.archive is not None, row.same_as)
            for row in await session.execute(
                select(StepSnapshot.index, StepSnapshot.archive, StepSnapshot.same_as).where(
                    StepSnapshot.task_id == parent.id
                )
            )
        }
    # After every step; `cat` and `submit` changed no file: they name the tar before theirs.
    assert stored == {0: (True, None), 1: (False, 0), 2: (True, None), 3: (False, 2)}
    at_end = scripted_llm.last_request("fork-snap-parent")  # its 4th call
    assert at_end is not None
    written = stdout((await observations(sessions, parent.id))[1])

    scripted_llm.add_script("fork-snap-child", after(2, SUBMIT))
    [child] = await fork(
        settings,
        redis,
        sessions,
        parent,
        step=2,
        rebuild="snapshot",
        llm={"model": "fork-snap-child"},
    )
    assert child.status == "succeeded", child.error
    assert child.fork is not None
    assert child.fork.rebuild == "snapshot"
    assert child.answer == written  # the time the parent wrote: not run again, not changed
    first = scripted_llm.last_request("fork-snap-child")
    assert first is not None
    assert scripted_llm.requests["fork-snap-child"] == 1
    # The loop only appends: the parent's call at step 2 was its call at step 3 less a turn.
    assert json.dumps(first["messages"]) == json.dumps(at_end["messages"][:-2])
    shared = await observations(sessions, child.id)
    assert shared[:2] == (await observations(sessions, parent.id))[:2]


async def test_a_snapshot_fork_of_a_task_without_snapshots_says_replay(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    parent = await run_parent(
        settings, redis, sessions, scripted_llm, "fork-nosnap-parent", [bash("echo a"), SUBMIT]
    )
    async with serve(create_app(settings)) as api:
        refused = await api.post(
            f"/v1/tasks/{parent.id}/fork", json={"step": 1, "rebuild": "snapshot"}
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["details"] == {"rebuild": "replay"}
        assert "sandbox.snapshots" in refused.json()["error"]["message"]
        from_start = await api.post(
            f"/v1/tasks/{parent.id}/fork", json={"step": 0, "rebuild": "snapshot"}
        )
        assert from_start.status_code == 202, from_start.text


async def test_a_running_task_forks_from_its_last_completed_step(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    """While the parent runs a long command, a fork from its last completed step starts
    from the snapshot taken at that step's boundary and finishes; the parent goes on."""
    task = await submit_parent(
        settings,
        redis,
        sessions,
        scripted_llm,
        "fork-running-parent",
        [
            bash("echo early > /testbed/output/answer.txt"),
            bash("sleep 5; echo late > /testbed/output/answer.txt"),
            SUBMIT,
        ],
        snapshots=True,
    )
    scripted_llm.add_script("fork-running-child", after(1, SUBMIT))
    async with asyncio.TaskGroup() as group:
        running = group.create_task(Worker(settings).run(burst=True))
        for _ in range(300):  # until step 0 is stored and the parent runs step 1
            async with sessions() as session:
                if await snapshots.stored(session, task.id, 1, 0):
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the parent never stored its first snapshot")
        assert (await tasks.get_task(sessions, "default", task.id)).status == "running"
        forked = await task_forks.fork_task(
            sessions,
            redis,
            settings,
            "default",
            task.id,
            TaskForkIn(step=1, rebuild="snapshot", llm=LLMOptions(model="fork-running-child")),
        )
        await running
    await Worker(settings).run(burst=True)  # the child, if the first worker left it
    parent = await tasks.get_task(sessions, "default", task.id)
    child = await tasks.get_task(sessions, "default", forked.tasks[0].id)
    assert (parent.status, parent.answer) == ("succeeded", "late\n")
    assert (child.status, child.answer) == ("succeeded", "early\n"), child.error
