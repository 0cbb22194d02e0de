"""The loop's rules (REFERENCE.md §1.3), one test each: a real sandbox and the scripted model.

The scripted server records what the loop sent (`last_request`), so the history
the model sees is checked as the model sees it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
import pytest_asyncio

from app.agent.loop import SKIPPED_CALL, UNUSABLE_CALL, run_agent
from app.agent.tools import NO_TOOL_CALL_NUDGE
from app.agent.types import AgentSpec, Outcome, Step
from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import OpenAIChatModel
from app.sandbox import DockerSandbox
from app.scripted import Script, ScriptedLLMServer, Turn
from app.states import FinishReason

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are a test agent."
USER = "Do the scripted thing."
Run = Callable[..., Any]


class RecordingSink:
    """Keeps what the loop reports (an EventSink)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.completed: list[Step] = []

    async def step_started(self, index: int) -> None:
        self.started.append(index)

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        self.completed.append(step)
        if next_index is not None:
            self.started.append(next_index)

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


class Harness:
    """Registers a script under a fresh model name and runs the loop against it."""

    def __init__(self, server: ScriptedLLMServer, box: DockerSandbox) -> None:
        self.server = server
        self.box = box
        self.name = ""
        self.sink = RecordingSink()

    async def run(
        self, turns: Sequence[Turn], *, kind: str = "openai", **spec: Any
    ) -> tuple[Outcome, list[dict[str, Any]]]:
        """Run to the end; the outcome and the messages of the newest request."""
        self.name = f"loop-{uuid.uuid4().hex[:8]}"
        script = Script(
            turns, repeat_last=spec.pop("repeat", False), fail_status=spec.pop("fail_status", None)
        )
        self.server.add_script(self.name, script)
        model = self._model(kind, spec.pop("max_retries", 0))
        options: dict[str, Any] = {"system_prompt": SYSTEM, "user_prompt": USER, "max_steps": 5}
        options.update(spec)
        try:
            outcome = await run_agent(AgentSpec(**options), self.box, model, self.sink)
        finally:
            await model.aclose()
        body = self.server.last_request(self.name) or {}
        return outcome, list(body.get("messages", []))

    def _model(self, kind: str, max_retries: int) -> OpenAIChatModel | AnthropicChatModel:
        options: dict[str, Any] = {
            "base_url": self.server.base_url,
            "api_key": "",
            "model": self.name,
            "temperature": None,
            "max_retries": max_retries,
            "backoff_s": 0.01,
        }
        if kind == "anthropic":
            return AnthropicChatModel(max_tokens=1024, **options)
        return OpenAIChatModel(max_tokens=None, **options)

    @property
    def requests(self) -> int:
        return self.server.requests.get(self.name, 0)

    def failures(self) -> list[str]:
        return [f for f in self.server.failures if f.startswith(self.name)]


@pytest_asyncio.fixture(loop_scope="module")
async def loop(scripted_llm: ScriptedLLMServer, box: DockerSandbox) -> AsyncIterator[Harness]:
    yield Harness(scripted_llm, box)


def bash(command: str, **extra: Any) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command}, **extra)


def create(path: str) -> dict[str, Any]:
    return {"command": "create", "path": path, "file_text": "x"}


def tool_replies(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]


async def test_history_starts_as_system_then_user_with_three_tools(loop: Harness) -> None:
    outcome, messages = await loop.run([Turn(tool="submit")])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM
    body = loop.server.last_request(loop.name)
    assert body is not None
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == ["str_replace_editor", "execute_bash", "submit"]
    assert "tool_choice" not in body
    assert outcome.finish_reason is FinishReason.submitted
    assert loop.failures() == []


async def test_steps_remaining_goes_on_the_newest_message_and_stays(loop: Harness) -> None:
    outcome, messages = await loop.run([bash("echo one"), bash("echo two"), Turn(tool="submit")])
    first, second, _ = outcome.steps
    assert messages[1]["content"] == f"{USER}\nSteps Remaining: 5"
    assert tool_replies(messages) == [
        ("call_0", f"{first.observation}\nSteps Remaining: 4"),
        ("call_1", f"{second.observation}\nSteps Remaining: 3"),
    ]
    assert "one" in first.observation
    assert "Steps Remaining" not in first.observation + second.observation  # not stored


async def test_a_conversation_over_the_budget_ends_with_context_limit(loop: Harness) -> None:
    big = bash("python3 -c \"print('x' * 8000)\"")
    outcome, _ = await loop.run([big], repeat=True, max_context_tokens=1500)
    assert outcome.finish_reason is FinishReason.context_limit
    assert outcome.error == "conversation exceeds 1500 tokens"
    assert len(outcome.steps) == 1  # the second call was never made
    assert loop.requests == 1


@pytest.mark.parametrize(
    ("profile", "answer_all", "answered"),
    [
        ("standard", None, True),  # the default of standard: every id answered
        ("reference", None, False),  # the package: only the first
        ("reference", True, True),  # the setting, for strict APIs
        ("standard", False, False),
    ],
)
async def test_only_the_first_tool_call_runs_and_the_setting_answers_the_rest(
    loop: Harness, profile: str, answer_all: bool | None, answered: bool
) -> None:
    tag = uuid.uuid4().hex[:8]
    first, second = f"/testbed/first-{tag}.txt", f"/testbed/second-{tag}.txt"
    extra = {
        "id": "call_extra",
        "type": "function",
        "function": {"name": "str_replace_editor", "arguments": json.dumps(create(second))},
    }
    turns = [
        Turn(tool="str_replace_editor", arguments=create(first), extra_calls=[extra]),
        Turn(tool="submit"),
    ]
    outcome, messages = await loop.run(
        turns, tools_profile=profile, answer_all_tool_calls=answer_all
    )
    assert outcome.finish_reason is FinishReason.submitted
    listing = await loop.box.exec(["ls", first, second])
    assert first.encode() in listing.stdout
    assert second.encode() not in listing.stdout
    replies = tool_replies(messages)
    assert replies[0][0] == "call_0"
    assert outcome.steps[0].observation in replies[0][1]
    expected = [("call_extra", f"{SKIPPED_CALL}\nSteps Remaining: 4")] if answered else []
    assert replies[1:] == expected


@pytest.mark.parametrize("profile", ["standard", "reference"])
async def test_an_unknown_tool_is_named_in_a_tool_message(loop: Harness, profile: str) -> None:
    turns = [Turn(tool="browse_web", arguments={"url": "x"}), Turn(tool="submit")]
    outcome, messages = await loop.run(turns, tools_profile=profile)
    assert outcome.steps[0].observation == "Unknown action: browse_web"
    assert tool_replies(messages) == [("call_0", "Unknown action: browse_web\nSteps Remaining: 4")]


async def test_a_turn_without_a_tool_call_gets_the_nudge_as_a_user_message(
    loop: Harness,
) -> None:
    turns = [Turn(content="Let me think first."), Turn(tool="submit", expect="YOU MUST USE")]
    outcome, messages = await loop.run(turns)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[3]["content"] == f"{NO_TOOL_CALL_NUDGE}\nSteps Remaining: 4"
    nudged = outcome.steps[0]
    assert (nudged.thought, nudged.action, nudged.observation) == (
        "Let me think first.",
        None,
        NO_TOOL_CALL_NUDGE,
    )
    assert outcome.usage.steps == 2  # a turn without a call is a step
    assert loop.failures() == []


@pytest.mark.parametrize(
    ("profile", "role", "observation", "sent_back"),
    [
        (
            "standard",
            "tool",
            "Error: the arguments of execute_bash must be a JSON object, got: {oo",
            "{}",  # a server that renders tool calls would refuse `{oo` in the next request
        ),
        ("reference", "user", NO_TOOL_CALL_NUDGE, "{oo"),  # the package: as returned
    ],
)
async def test_malformed_arguments_get_an_observation_not_a_crash(
    loop: Harness, profile: str, role: str, observation: str, sent_back: str
) -> None:
    turns = [Turn(tool="execute_bash", arguments="{oo"), Turn(tool="submit")]
    outcome, messages = await loop.run(turns, tools_profile=profile)
    assert outcome.finish_reason is FinishReason.submitted
    assert outcome.steps[0].observation == observation
    assert messages[3]["role"] == role
    assert messages[3]["content"] == f"{observation}\nSteps Remaining: 4"
    (call,) = messages[2]["tool_calls"]
    assert call["function"]["arguments"] == sent_back
    assert call["function"]["name"] == "execute_bash"


async def test_a_call_cut_off_by_max_tokens_goes_back_as_json_the_next_request_takes(
    loop: Harness,
) -> None:
    """A completion cut off inside its tool call: the model's mistake costs it a step and
    an error to read, never the rollout (llama.cpp refused the whole next request)."""
    cut = Turn(tool="execute_bash", arguments='{"command": "echo hel')
    outcome, messages = await loop.run([cut, Turn(tool="submit")])
    assert outcome.finish_reason is FinishReason.submitted
    assert outcome.error is None
    assert outcome.steps[0].observation.startswith("Error: the arguments of execute_bash")
    assert '{"command": "echo hel' in outcome.steps[0].observation
    for message in messages:
        for call in message.get("tool_calls") or []:
            json.loads(call["function"]["arguments"])  # every call in the history parses


async def test_reference_with_answer_all_also_answers_an_unusable_call(loop: Harness) -> None:
    turns = [Turn(tool="execute_bash", arguments="{oo"), Turn(tool="submit")]
    _, messages = await loop.run(turns, tools_profile="reference", answer_all_tool_calls=True)
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool", "user"]
    assert messages[3]["content"] == UNUSABLE_CALL
    assert messages[4]["content"] == f"{NO_TOOL_CALL_NUDGE}\nSteps Remaining: 4"


async def test_submit_ends_the_run_and_every_response_is_a_step(loop: Harness) -> None:
    outcome, _ = await loop.run([Turn(content="hmm"), Turn(tool="submit"), bash("echo never")])
    assert outcome.finish_reason is FinishReason.submitted
    assert outcome.steps[-1].observation == "<<< Finished >>>"
    assert loop.requests == 2
    assert loop.sink.started == [0, 1]
    assert loop.sink.completed == outcome.steps

    outcome, _ = await loop.run([Turn(content="still thinking")], repeat=True, max_steps=3)
    assert outcome.finish_reason is FinishReason.max_steps
    assert [s.index for s in outcome.steps] == [0, 1, 2]
    assert outcome.usage.steps == 3
    assert loop.requests == 3


async def test_time_and_tokens_are_recorded_per_step_and_per_task(loop: Harness) -> None:
    turns = [bash("sleep 0.4; echo done", delay_s=0.3), Turn(tool="submit")]
    outcome, _ = await loop.run(turns)
    first, second = outcome.steps
    assert first.llm_ms >= 300  # the model took 0.3 s to answer
    assert first.tool_ms >= 400  # the command slept 0.4 s
    assert first.exit_code == 0
    assert second.prompt_tokens > first.prompt_tokens > 0  # the history grew
    assert first.completion_tokens > 0
    usage = outcome.usage
    assert usage.prompt_tokens == first.prompt_tokens + second.prompt_tokens
    assert usage.completion_tokens == first.completion_tokens + second.completion_tokens
    assert usage.llm_seconds == pytest.approx((first.llm_ms + second.llm_ms) / 1000)
    assert usage.sandbox_seconds == pytest.approx((first.tool_ms + second.tool_ms) / 1000)


async def test_the_task_timeout_and_a_failing_model_end_the_run_cleanly(loop: Harness) -> None:
    outcome, _ = await loop.run([bash("echo slow", delay_s=5)], timeout_s=0.5)
    assert outcome.finish_reason is FinishReason.timeout
    assert outcome.error == "task exceeded its timeout of 0.5 s"

    failed, _ = await loop.run([Turn(tool="submit")], fail_status=503, max_retries=1)
    assert failed.finish_reason is FinishReason.llm_error
    assert failed.error is not None
    assert "HTTP 503" in failed.error
    assert "after 2 attempt(s)" in failed.error


@pytest.mark.parametrize("profile", ["standard", "reference"])
async def test_an_anthropic_model_runs_the_loop_with_thinking_and_parallel_calls(
    loop: Harness, profile: str
) -> None:
    extra = {
        "id": "toolu_extra",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": '{"command": "echo extra"}'},
    }
    turns = [
        bash("echo hi", reasoning="I should say hi.", extra_calls=[extra]),
        Turn(tool="submit", reasoning="Done.", expect="hi"),
    ]
    outcome, messages = await loop.run(turns, kind="anthropic", tools_profile=profile)
    assert outcome.finish_reason is FinishReason.submitted
    assert [s.reasoning for s in outcome.steps] == ["I should say hi.", "Done."]
    assert "hi" in outcome.steps[0].observation
    assert loop.failures() == []  # thinking returned verbatim, every tool_use answered
    results = [b for b in messages[2]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_scripted_0", "toolu_extra"]
