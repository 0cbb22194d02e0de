"""Vanilla mode through the real `Runner` and the scripted model server: one call, no tools,
no sandbox; its resolution (app/domain/resolve.py) and the scripted server's no-tools scripts."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from app.agent.types import Step
from app.agent.vanilla import embed_documents
from app.config import Settings
from app.domain.resolve import check_inputs, parse_submission, resolve_spec
from app.errors import InvalidInput
from app.llm.openai import OpenAIChatModel
from app.runner.episode import EpisodeResult, Runner
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.policy import SandboxConfig
from app.sandbox.reaper import TASK_LABEL
from app.scripted import Script, ScriptedLLMServer, Turn
from app.specs import stored
from app.states import FinishReason


class RecordingSink:
    """Every report of the episode, in order (an EventSink)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def step_started(self, index: int) -> None:
        self.events.append(("started", index))

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        self.events.append(("completed", (step, next_index)))

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        self.events.append((kind, dict(data)))

    def steps(self) -> list[Step]:
        return [step for kind, (step, _) in self.of("completed")]

    def of(self, kind: str) -> list[tuple[str, Any]]:
        return [event for event in self.events if event[0] == kind]


class NoDocker(DockerHost):
    """A Docker host that counts the sandboxes asked of it (a vanilla task asks none)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def create_sandbox(self, config: SandboxConfig) -> DockerSandbox:
        self.asked += 1
        raise AssertionError("a vanilla task created a sandbox")


def vanilla_settings(server: ScriptedLLMServer, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "llm_base_url": server.base_url,
        "llm_model": "unset",
        "llm_max_retries": 0,
        "llm_retry_backoff_s": 0.01,
        **overrides,
    }
    return Settings(_env_file=None, **options)


def script(server: ScriptedLLMServer, *turns: Turn, **options: Any) -> str:
    name = f"vanilla-{uuid.uuid4().hex[:8]}"
    server.add_script(name, Script(list(turns), tools="none", **options))
    return name


async def run(
    server: ScriptedLLMServer,
    model: str,
    prompt: str = "What is 6 * 7?",
    *,
    settings: Settings | None = None,
    inputs: list[tuple[str, bytes]] | None = None,
    stop: asyncio.Event | None = None,
    **body: Any,
) -> tuple[EpisodeResult, RecordingSink, NoDocker, dict[str, str]]:
    settings = settings or vanilla_settings(server)
    submission = {"prompt": prompt, "mode": "vanilla", "llm": {"model": model}, **body}
    spec = resolve_spec(parse_submission(submission), settings)
    docker, sink = NoDocker(), RecordingSink()
    labels = {TASK_LABEL: f"tsk_vanilla_{uuid.uuid4().hex[:8]}"}
    result = await Runner(settings, docker).run(
        spec, prompt, sink, labels=labels, inputs=inputs or [], stop=stop
    )
    return result, sink, docker, labels


def containers_labelled(labels: Mapping[str, str]) -> list[str]:
    filters = [f"--filter=label={key}={value}" for key, value in labels.items()]
    done = subprocess.run(
        ["docker", "ps", "-aq", *filters], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_vanilla_task_is_one_call_without_tools_and_answers_with_its_text(
    scripted_llm: ScriptedLLMServer, kind: str
) -> None:
    model = script(scripted_llm, Turn(content="It is 42.", reasoning="six sevens"))
    settings = vanilla_settings(scripted_llm, llm_kind=kind)
    result, sink, docker, labels = await run(scripted_llm, model, settings=settings)

    assert scripted_llm.requests[model] == 1
    assert [f for f in scripted_llm.failures if f.startswith(model)] == []
    body = scripted_llm.last_request(model) or {}
    assert "tools" not in body
    assert "tool_choice" not in body
    assert "system" not in body
    assert body["messages"][0]["role"] == "user"
    assert "What is 6 * 7?" in str(body["messages"][0]["content"])
    assert len(body["messages"]) == 1
    assert all(m.get("role") != "system" for m in body["messages"])

    outcome = result.outcome
    assert (outcome.finish_reason, outcome.error) == (FinishReason.submitted, None)
    assert result.answer(1000) == "It is 42."
    [step] = sink.steps()
    assert (step.index, step.thought, step.reasoning) == (0, "It is 42.", "six sevens")
    assert (step.action, step.observation, step.exit_code, step.interrupted) == (
        None,
        "",
        None,
        None,
    )
    assert sink.events[0] == ("started", 0)
    assert sink.events[-1] == ("completed", (step, None)), "the only step, and nothing after it"
    streamed = "".join(str(data.get("text", "")) for _, data in sink.of("llm.delta"))
    assert streamed == "It is 42.", "the answer streamed live as llm.delta"
    usage = outcome.usage
    assert usage.steps == 1
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert (step.prompt_tokens, step.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert usage.llm_seconds == step.llm_ms / 1000
    assert usage.sandbox_seconds == 0
    assert docker.asked == 0
    assert await asyncio.to_thread(containers_labelled, labels) == []


async def test_input_files_are_embedded_between_the_document_markers(
    scripted_llm: ScriptedLLMServer,
) -> None:
    model = script(scripted_llm, Turn(content="Paris"))
    inputs = [("docs/b.txt", b"Beta text."), ("a.txt", "Alpha \u00e9t\u00e9.".encode())]
    result, _, docker, _ = await run(scripted_llm, model, "Which city?", inputs=inputs)
    [message] = (scripted_llm.last_request(model) or {})["messages"]
    assert message == {
        "role": "user",
        "content": (
            "BEGIN INPUT DOCUMENTS\n\n"
            "BEGIN DOCUMENT 1:\nBeta text.\nEND DOCUMENT 1\n\n"
            "BEGIN DOCUMENT 2:\nAlpha \u00e9t\u00e9.\nEND DOCUMENT 2\n\n"
            "END INPUT DOCUMENTS\n\n"
            "Answer the following question using the input documents provided above.\n\n"
            "START QUESTION\n\nWhich city?\n\nEND QUESTION\n"
        ),
    }
    assert result.answer(100) == "Paris"
    assert docker.asked == 0
    assert embed_documents("q", []) == "q", "no documents: the problem as it is"


async def test_a_custom_prompt_pair_is_the_arms_template(scripted_llm: ScriptedLLMServer) -> None:
    model = script(scripted_llm, Turn(content="\\boxed{42}"))
    pair = {"system": "Be brief.", "instance": "Q: {problem_statement}\nReason step by step."}
    await run(scripted_llm, model, "6 * 7?", prompt_config=pair)
    body = scripted_llm.last_request(model) or {}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: 6 * 7?\nReason step by step."},
    ]


async def test_a_failing_model_ends_the_task_with_llm_error_and_no_answer(
    scripted_llm: ScriptedLLMServer,
) -> None:
    model = script(scripted_llm, Turn(content="never"), fail_status=503)
    result, sink, docker, _ = await run(scripted_llm, model)
    assert result.outcome.finish_reason is FinishReason.llm_error
    assert "503" in (result.outcome.error or "")
    assert result.answer(100) is None
    assert result.files == []
    [step] = sink.steps()
    assert step.interrupted == "llm_error", "the announced step is closed, not left open"
    assert docker.asked == 0


async def test_an_empty_response_is_no_answer(scripted_llm: ScriptedLLMServer) -> None:
    model = script(scripted_llm, Turn(content="", reasoning="ran out while thinking"))
    result, sink, _, _ = await run(scripted_llm, model)
    assert result.outcome.finish_reason is FinishReason.max_steps
    assert result.answer(100) is None
    assert len(sink.steps()) == 1


async def test_a_cancel_and_the_timeout_cut_the_call(scripted_llm: ScriptedLLMServer) -> None:
    slow = script(scripted_llm, Turn(content="late", delay_s=5))
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    cancelled, sink, _, _ = await run(scripted_llm, slow, stop=stop)
    assert cancelled.outcome.finish_reason is FinishReason.cancelled
    assert [s.interrupted for s in sink.steps()] == ["cancelled"]

    timed_out, sink, _, _ = await run(scripted_llm, slow, limits={"timeout_s": 1})
    assert timed_out.outcome.finish_reason is FinishReason.timeout
    assert timed_out.outcome.error is not None
    assert "1" in timed_out.outcome.error
    assert [s.interrupted for s in sink.steps()] == ["timeout"]


async def test_a_no_tools_script_refuses_a_request_that_offers_tools(
    scripted_llm: ScriptedLLMServer,
) -> None:
    model = script(scripted_llm, Turn(content="x"))
    tools = [{"type": "function", "function": {"name": "submit", "parameters": {}}}]
    client = OpenAIChatModel(base_url=scripted_llm.base_url, api_key="", model=model)
    try:
        await client.complete([{"role": "user", "content": "q"}], tools)
    finally:
        await client.aclose()
    assert [f for f in scripted_llm.failures if f.startswith(model)] != []


# Resolution


def resolve(**body: Any) -> Any:
    settings = Settings(_env_file=None, llm_base_url="http://127.0.0.1:9/v1", llm_model="m")
    return resolve_spec(parse_submission({"prompt": "p", **body}), settings)


def test_a_vanilla_spec_stores_its_mode_and_a_sandbox_one_looks_as_before() -> None:
    vanilla = resolve(mode="vanilla")
    assert vanilla.mode == "vanilla"
    assert stored(vanilla)["mode"] == "vanilla"
    assert vanilla.prompt is not None
    assert (vanilla.prompt_config, vanilla.prompt.system, vanilla.prompt.instance) == (
        "vanilla",
        "",
        "",
    )
    sandbox = resolve()
    assert sandbox.mode == "sandbox"
    assert "mode" not in stored(sandbox)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"tools": {"shell": "persistent"}}, "tools"),
        ({"tools": {"profile": "reference"}}, "tools"),
        ({"prompt_config": "math"}, "prompt_config"),
    ],
)
def test_vanilla_refuses_what_only_a_sandbox_has(body: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        resolve(mode="vanilla", **body)
    assert [p["loc"] for p in caught.value.details] == [["body", where]]


def test_a_vanilla_tasks_input_files_must_be_text() -> None:
    settings = Settings(_env_file=None, llm_base_url="http://127.0.0.1:9/v1", llm_model="m")
    binary = base64.b64encode(b"\xff\xfe\x00bin").decode()
    files = [{"path": "blob.bin", "content_base64": binary}]
    with pytest.raises(InvalidInput, match="UTF-8"):
        check_inputs(
            parse_submission({"prompt": "p", "mode": "vanilla", "input_files": files}), settings
        )
    sandbox = parse_submission({"prompt": "p", "input_files": files})
    assert check_inputs(sandbox, settings) == [("blob.bin", b"\xff\xfe\x00bin")]
