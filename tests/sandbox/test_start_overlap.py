"""The model is asked while the sandbox starts, and the start's outcome is never lost.

A cold task's first model request does not wait for Docker (`app.agent.pending_sandbox`):
a sandbox that cannot start still ends the task as a `sandbox_error` at its first command,
and a loop that ends before the sandbox is up (the model failed) still has the sandbox
removed once it is. Real Docker, the scripted LLM.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import replace

from app.config import Settings
from app.domain.resolve import resolve_spec
from app.runner.episode import Runner
from app.sandbox import DockerHost
from app.schemas.tasks import TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.states import FinishReason
from tests.sandbox.test_pool import NullSink

LIST = Turn("execute_bash", {"command": "ls /testbed"})


def labelled(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandhive.test={label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


async def test_a_sandbox_that_cannot_start_ends_the_task_at_its_first_command(
    settings: Settings, scripted_llm: ScriptedLLMServer, docker_image: str
) -> None:
    name = f"overlap-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(name, Script([LIST]))
    spec = resolve_spec(
        TaskCreate.model_validate({"prompt": "p", "llm": {"model": name}}), settings
    )
    label = uuid.uuid4().hex
    async with DockerHost() as docker:
        runner = Runner(settings, docker)
        episode = runner.episode(spec, "p", labels={"sandhive.test": label})
        missing = replace(episode.sandbox, image="sandhive-missing-image:none")
        sink = NullSink()
        model = runner.model(spec.llm)
        try:
            result = await runner.play(replace(episode, sandbox=missing), model, sink)
        finally:
            await model.aclose()
    assert scripted_llm.requests.get(name) == 1, "the model was asked before the sandbox was up"
    assert result.outcome.finish_reason is FinishReason.sandbox_error
    assert "sandhive-missing-image" in (result.outcome.error or "")
    [cut] = sink.steps
    assert (cut.index, cut.interrupted) == (0, "sandbox_error"), "the cut step is stored"
    assert cut.action is not None
    assert cut.action.tool == "execute_bash"
    assert not labelled(label)


async def test_a_loop_that_ends_before_the_sandbox_is_up_still_removes_it(
    settings: Settings, scripted_llm: ScriptedLLMServer, docker_image: str
) -> None:
    name = f"overlap-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(name, Script([LIST], fail_status=400))
    spec = resolve_spec(
        TaskCreate.model_validate({"prompt": "p", "llm": {"model": name}}), settings
    )
    label = uuid.uuid4().hex
    held: list[object] = []
    async with DockerHost() as docker:
        runner = Runner(settings, docker)
        episode = runner.episode(spec, "p", labels={"sandhive.test": label})
        model = runner.model(spec.llm)
        try:
            result = await runner.play(episode, model, NullSink(), on_sandbox=held.append)
        finally:
            await model.aclose()
    assert result.outcome.finish_reason is FinishReason.llm_error
    assert [box is None for box in held] == [False, True], (
        "the file service was handed the sandbox once it was up, and told before it went"
    )
    assert not labelled(label), "removed although the loop had ended before it was up"


async def test_a_start_failing_after_the_model_did_leaves_the_models_failure_standing(
    settings: Settings, scripted_llm: ScriptedLLMServer, docker_image: str
) -> None:
    name = f"overlap-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(name, Script([LIST], fail_status=400))
    spec = resolve_spec(
        TaskCreate.model_validate({"prompt": "p", "llm": {"model": name}}), settings
    )
    async with DockerHost() as docker:
        runner = Runner(settings, docker)
        episode = runner.episode(spec, "p", labels={"sandhive.test": uuid.uuid4().hex})
        missing = replace(episode.sandbox, image="sandhive-missing-image:none")
        model = runner.model(spec.llm)
        try:
            result = await runner.play(replace(episode, sandbox=missing), model, NullSink())
        finally:
            await model.aclose()
    assert result.outcome.finish_reason is FinishReason.llm_error, result.outcome.error
