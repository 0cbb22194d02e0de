"""Vanilla mode: the problem as one user message, one model call, no tools and no sandbox.

The baseline the paper compares the sandbox against (REFERENCE.md §1.9, the
benchmark's `--mode llm`): the answer is the response text as it came. Documents
of a long-context row are embedded in the message between the package's markers
(`embed_documents`). Recorded like the loop's steps: one step, announced, streamed
as `llm.delta` and completed (no action, empty observation), with its usage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.agent import live
from app.agent.inflight import InFlight
from app.agent.loop import account_llm, run_to_end
from app.agent.types import ChatModel, EventSink, Message, Outcome
from app.states import FinishReason

NO_ANSWER = "the model's response has no text"


@dataclass(frozen=True)
class VanillaSpec:
    """The one call of a vanilla task, its messages already rendered."""

    system_prompt: str
    """Sent as a system message only when not empty (the package sends none)."""
    user_prompt: str
    timeout_s: float | None = None


def embed_documents(problem: str, documents: Sequence[str]) -> str:
    """The problem with its documents in front, as the package's long-context prompt has them;
    the problem as it is when there are none."""
    if not documents:
        return problem
    # The markers are the package's (benchmark/long_context/vanilla_llm_prompt.py).
    embedded = "\n\n".join(
        f"BEGIN DOCUMENT {i}:\n{text}\nEND DOCUMENT {i}" for i, text in enumerate(documents, 1)
    )
    return (
        f"BEGIN INPUT DOCUMENTS\n\n{embedded}\n\nEND INPUT DOCUMENTS\n\n"
        "Answer the following question using the input documents provided above.\n\n"
        f"START QUESTION\n\n{problem}\n\nEND QUESTION\n"
    )


def vanilla_messages(spec: VanillaSpec) -> list[Message]:
    system = [{"role": "system", "content": spec.system_prompt}] if spec.system_prompt else []
    return [*system, {"role": "user", "content": spec.user_prompt}]


async def run_vanilla(
    spec: VanillaSpec, model: ChatModel, sink: EventSink, outcome: Outcome | None = None
) -> str | None:
    """Ask once; the response text, or None when none came (the reason is in `outcome`).

    Never raises for model or time failures; a cancel stores the step as far as it got.
    """
    if outcome is None:
        outcome = Outcome(finish_reason=FinishReason.llm_error)
    flight = InFlight()
    return await run_to_end(
        _ask(spec, model, sink, outcome, flight), spec.timeout_s, sink, outcome, flight
    )


async def _ask(
    spec: VanillaSpec, model: ChatModel, sink: EventSink, outcome: Outcome, flight: InFlight
) -> str | None:
    step = flight.open(0)
    await sink.step_started(0)
    started = time.monotonic()
    async with live.model_deltas(sink, 0) as on_delta:
        completion = await model.complete(vanilla_messages(spec), [], flight.tee_delta(on_delta))
    step.llm_ms = int((time.monotonic() - started) * 1000)
    account_llm(outcome, step, completion)
    answer = completion.content if completion.content.strip() else None
    if answer is None:
        _finish(outcome, FinishReason.max_steps, NO_ANSWER)
    else:
        outcome.finish_reason, outcome.error = FinishReason.submitted, None
    await sink.step_completed(step, None)
    flight.close()
    return answer


def _finish(outcome: Outcome, reason: FinishReason, error: str) -> None:
    outcome.finish_reason = reason
    outcome.error = error
