"""The agent loop of the paper: ask the model, run its first tool call, answer, repeat.

Shaped after the reference package (REFERENCE.md §1.3): history starts as
[system, user]; before every call "\\nSteps Remaining: N" is appended to the
newest message and stays there; only the first tool call runs; a turn with no
tool call gets the continue nudge as a user message; `submit` ends the run.
Sandhive adds: a wall-clock timeout, a context budget that ends the run
cleanly, usage accounting, an event sink for every step, and the multi-call
policy `answer_all_tool_calls` (every other tool-call id gets a "not run" reply
so strict APIs accept the history; default on in `standard`, off in `reference`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from app.agent import live
from app.agent.inflight import InFlight
from app.agent.tools import (
    NO_TOOL_CALL_NUDGE,
    ToolContext,
    ToolResult,
    is_no_call,
    run_tool,
    tool_schemas,
)
from app.agent.types import (
    Action,
    AgentSpec,
    ChatModel,
    Completion,
    EventSink,
    Message,
    Outcome,
    Resume,
    Sandbox,
    Step,
    ToolCall,
)
from app.errors import ContextOverflow, LLMError, ReplayDiverged, SandboxError
from app.states import FinishReason, timeout_error

log = logging.getLogger(__name__)
T = TypeVar("T")
SKIPPED_CALL = "Error: only the first tool call of a turn is executed; this call was not run."
UNUSABLE_CALL = "Error: this tool call has no usable name or arguments; it was not run."


def answers_all_calls(spec: AgentSpec) -> bool:
    """The multi-call policy: reply to every tool-call id, or (reference) only the first."""
    if spec.answer_all_tool_calls is not None:
        return spec.answer_all_tool_calls
    return spec.tools_profile != "reference"


def estimate_tokens(messages: Sequence[Message]) -> int:
    """Characters / 4: the package's own fallback, good enough to stop before the model does."""
    return len(json.dumps(messages, ensure_ascii=False)) // 4


async def run_agent(
    spec: AgentSpec,
    box: Sandbox,
    model: ChatModel,
    sink: EventSink,
    outcome: Outcome | None = None,
    resume: Resume | None = None,
) -> Outcome:
    """Run one task to its end; never raises for model, sandbox or time failures.

    `outcome` (the caller's, or a new one) is filled as the loop goes: steps and usage
    stay in it when the loop is cancelled, which is how a cancelled task keeps its usage.
    `resume`: go on from another loop's step boundary (a fork) instead of the prompt.
    """
    if outcome is None:
        outcome = Outcome(finish_reason=FinishReason.max_steps)
    outcome.finish_reason = FinishReason.max_steps  # unless something else ends the run
    flight = InFlight()
    work = _loop(spec, box, model, sink, outcome, flight, resume)
    await run_to_end(work, spec.timeout_s, sink, outcome, flight)
    return outcome


async def run_to_end(
    work: Coroutine[Any, Any, T],
    timeout_s: float | None,
    sink: EventSink,
    outcome: Outcome,
    flight: InFlight,
) -> T | None:
    """`work`'s result within `timeout_s`, or None: a timeout, model or sandbox failure ends
    the run in `outcome` (never raised), and whatever step it cut is stored as interrupted."""
    result: T | None = None
    try:
        async with asyncio.timeout(timeout_s):
            result = await work
    except TimeoutError:
        _finish(outcome, FinishReason.timeout, timeout_error(timeout_s))
    except ContextOverflow as exc:  # the server's window, not ours: the model's budget too
        _finish(outcome, FinishReason.context_limit, exc.message)
    except ReplayDiverged as exc:  # a fork's replay saw another observation than recorded
        _finish(outcome, FinishReason.replay_diverged, exc.message)
    except LLMError as exc:
        _finish(outcome, FinishReason.llm_error, exc.message)
    except SandboxError as exc:
        _finish(outcome, FinishReason.sandbox_error, exc.message)
    except asyncio.CancelledError:
        await report_cut(flight, sink, outcome, FinishReason.cancelled)
        raise
    await report_cut(flight, sink, outcome, outcome.finish_reason)
    return result


async def report_cut(
    flight: InFlight, sink: EventSink, outcome: Outcome, reason: FinishReason
) -> None:
    """Store the step the run was cut in, as far as it got, so no started step stays open."""
    step = flight.cut(reason.value)
    if step is None:
        return
    if step not in outcome.steps:
        outcome.steps.append(step)
    try:
        await sink.step_completed(step, None)
    except Exception as exc:  # a broken sink surfaces at its flush; the run's end stands
        log.warning("could not report the interrupted step %d: %r", step.index, exc)


async def _loop(
    spec: AgentSpec,
    box: Sandbox,
    model: ChatModel,
    sink: EventSink,
    outcome: Outcome,
    flight: InFlight,
    resume: Resume | None = None,
) -> None:
    messages = first_messages(spec)
    index = 0
    if resume is not None:  # marked already: its newest message has its Steps Remaining
        messages, index = copy.deepcopy(resume.messages), resume.index
    tools = tool_schemas(spec.tools_profile, spec.tools_shell)
    ctx = ToolContext(
        box=box,
        profile=spec.tools_profile,
        shell=spec.tools_shell,
        workdir=spec.workdir,
        command_timeout_s=spec.command_timeout_s,
        on_output=None,
    )
    answer_all = answers_all_calls(spec)
    if resume is None and (spec.max_steps < 1 or not _next_prompt_fits(spec, messages, 0, outcome)):
        return
    flight.open(index)
    await sink.step_started(index)
    while True:
        step = await _step(messages, tools, ctx, model, outcome, flight, answer_all, sink)
        # Decided before the step is reported, so the sink can announce the next one with it.
        going_on = (
            outcome.finish_reason is not FinishReason.submitted
            and index + 1 < spec.max_steps
            and _next_prompt_fits(spec, messages, index + 1, outcome)
        )
        await sink.step_completed(step, index + 1 if going_on else None)
        if not going_on:
            flight.close()
            return
        index += 1
        flight.open(index)  # announced with the step just reported


def first_messages(spec: AgentSpec) -> list[Message]:
    """The history the loop starts from, as the package's: [system, user]."""
    return [
        {"role": "system", "content": spec.system_prompt},
        {"role": "user", "content": spec.user_prompt},
    ]


def _next_prompt_fits(
    spec: AgentSpec, messages: list[Message], index: int, outcome: Outcome
) -> bool:
    """Mark the newest message with the steps left; False (run ends) when over the budget."""
    mark_steps_left(messages, spec, index)
    if estimate_tokens(messages) > spec.max_context_tokens:
        limit = spec.max_context_tokens
        _finish(outcome, FinishReason.context_limit, f"conversation exceeds {limit} tokens")
        return False
    return True


async def _step(
    messages: list[Message],
    tools: list[dict[str, object]],
    ctx: ToolContext,
    model: ChatModel,
    outcome: Outcome,
    flight: InFlight,
    answer_all: bool,
    sink: EventSink,
) -> Step:
    step = flight.step
    assert step is not None, "the loop opens every step before running it"
    index = step.index
    started = time.monotonic()
    async with live.model_deltas(sink, index) as on_delta:  # llm.delta while it streams
        completion = await model.complete(messages, tools, flight.tee_delta(on_delta))
    step.llm_ms = int((time.monotonic() - started) * 1000)
    account_llm(outcome, step, completion)
    step.message = completion.message  # as the model sent it: a replay repairs it again
    messages.append(replayable(completion.message, ctx.profile))
    calls = completion.tool_calls
    if not has_usable_call(calls, ctx.profile):
        step.observation = NO_TOOL_CALL_NUDGE
        messages.extend(turn_answers(calls, NO_TOOL_CALL_NUDGE, answer_all, ctx.profile))
        return step
    call = calls[0]
    step.action = Action(tool=call.name, arguments=call.arguments or {})
    async with live.tool_call(sink, index, call) as on_output:  # tool.output while it runs
        on_output = flight.tee_output(on_output)
        result = await _run_call(call, replace(ctx, on_output=on_output), step, outcome)
    messages.extend(turn_answers(calls, result.observation, answer_all, ctx.profile))
    return step


def has_usable_call(calls: Sequence[ToolCall], profile: str) -> bool:
    return bool(calls) and not is_no_call(calls[0], profile)


def turn_answers(
    calls: Sequence[ToolCall], observation: str, answer_all: bool, profile: str
) -> list[Message]:
    """What the history takes after a turn's assistant message: its first call's answer
    (and, with `answer_all`, a "not run" answer to each further call, since strict
    OpenAI-style APIs reject a history with unanswered tool-call ids); for a turn with no
    usable call, the nudge as a user message, as the package sends it (after "not run"
    answers to its unusable calls, with `answer_all`)."""
    if not has_usable_call(calls, profile):
        unusable = [_tool_message(c, UNUSABLE_CALL) for c in calls] if answer_all else []
        return [*unusable, {"role": "user", "content": NO_TOOL_CALL_NUDGE}]
    skipped = [_tool_message(c, SKIPPED_CALL) for c in calls[1:]] if answer_all else []
    return [_tool_message(calls[0], observation), *skipped]


def mark_steps_left(messages: list[Message], spec: AgentSpec, index: int) -> None:
    """The suffix the loop puts on the newest message before asking for step `index`."""
    messages[-1]["content"] = (
        f"{messages[-1]['content']}\nSteps Remaining: {spec.max_steps - index}"
    )


async def _run_call(call: ToolCall, ctx: ToolContext, step: Step, outcome: Outcome) -> ToolResult:
    started = time.monotonic()
    result = await run_tool(call, ctx)
    step.tool_ms = int((time.monotonic() - started) * 1000)
    outcome.usage.sandbox_seconds += step.tool_ms / 1000
    step.observation = result.observation
    step.exit_code = result.exit_code
    if result.done:
        outcome.finish_reason = FinishReason.submitted
    return result


def account_llm(outcome: Outcome, step: Step, completion: Completion) -> None:
    step.thought = completion.content
    step.reasoning = completion.reasoning
    step.prompt_tokens = completion.prompt_tokens
    step.completion_tokens = completion.completion_tokens
    step.capture = completion.capture
    outcome.usage.steps += 1
    outcome.usage.prompt_tokens += completion.prompt_tokens
    outcome.usage.completion_tokens += completion.completion_tokens
    outcome.usage.llm_seconds += step.llm_ms / 1000
    outcome.steps.append(step)


def replayable(message: Message, profile: str) -> Message:
    """The assistant message as the history sends it back. Standard profile: a tool call
    whose arguments are not JSON (cut off by `max_tokens`, or malformed) goes back with
    `{}`, since servers that render tool calls through a chat template refuse the whole
    next request over it (llama.cpp answers 500), which would end a rollout for the
    model's own mistake as if the service had failed; the tool's answer quotes what was
    sent. Reference profile: as returned, as the paper's package sends it."""
    calls = message.get("tool_calls")
    if profile == "reference" or not isinstance(calls, list):
        return message
    repaired = [_with_json_arguments(call) for call in calls]
    return message if repaired == calls else {**message, "tool_calls": repaired}


def _with_json_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    raw = function.get("arguments")
    if not isinstance(raw, str) or not raw.strip():
        return call
    try:
        json.loads(raw)
    except ValueError:
        return {**call, "function": {**function, "arguments": "{}"}}
    return call


def _tool_message(call: ToolCall, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def _finish(outcome: Outcome, reason: FinishReason, error: str) -> None:
    outcome.finish_reason = reason
    outcome.error = error
