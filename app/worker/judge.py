"""The `llm_judge` call: the judge's profile and model asked `repeats` times, at once.

The client is the worker's Runner's (`Runner.model`): the same profiles, URL, key, timeout,
retries and shared HTTP connection pool as every task's model. What to send and how to
read the replies is `app.scoring.judge`; every exchange goes into the item's detail,
and a failed call is a ScorerError (the item's error, never a silent 0); a judge out of
reach is a JudgeUnavailable, which the scoring loop tries again later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from app.agent.types import ChatModel, Completion, Message
from app.errors import AppError, LLMError
from app.llm.transport import transient
from app.runner.episode import Runner
from app.scoring.judge import LlmJudgeScorer, judge_messages, judged
from app.scoring.types import JudgeUnavailable, Score, ScorerError
from app.specs import LLMSpec


async def judge(
    runner: Runner, scorer: LlmJudgeScorer, answer: str | None, row: Mapping[str, Any]
) -> Score:
    """The judge's score of `answer` for `row`; ScorerError when it could not judge."""
    if answer is None:
        raise ScorerError("there is no answer to judge")
    messages = judge_messages(scorer, answer, row)
    llm = _llm(runner, scorer)
    model = runner.model(llm)
    try:
        replies = await asyncio.gather(
            *(_ask(model, messages) for _ in range(scorer.repeats)), return_exceptions=True
        )
    finally:
        await model.aclose()
    exchanges: list[dict[str, Any]] = []
    failure: BaseException | None = None
    for reply in replies:
        if isinstance(reply, Completion):
            exchanges.append(_exchange(reply))
        else:
            failure = failure or reply
            exchanges.append({"error": _why(reply)})
    detail = {"model": llm.model, "prompt": messages, "exchanges": exchanges}
    if failure is not None:
        if not isinstance(failure, Exception):
            raise failure  # a cancellation: the worker stops
        # A judge out of reach is the infrastructure's failure (the caller may try again
        # later); any other failure of the call (a refusal, a reply it could not read) is
        # this item's: retrying it forever would keep the experiment running.
        failed = JudgeUnavailable if _unreachable(failure) else ScorerError
        raise failed(f"the judge's call failed: {_why(failure)}", detail)
    score = judged(scorer, exchanges, answer)
    return Score(score.value, {**score.detail, "model": llm.model, "prompt": messages})


def _llm(runner: Runner, scorer: LlmJudgeScorer) -> LLMSpec:
    profile = runner.settings.llm_profiles().get(scorer.profile)
    if profile is None:  # checked at creation; the server's profiles changed since
        raise ScorerError(f"the judge's llm profile {scorer.profile!r} is not configured")
    return LLMSpec(
        profile=scorer.profile,
        model=scorer.model or profile.model,
        temperature=scorer.temperature,
        max_tokens_per_call=runner.settings.default_max_tokens_per_call,
    )


async def _ask(model: ChatModel, messages: list[dict[str, str]]) -> Completion:
    sent: list[Message] = [dict(message) for message in messages]
    return await model.complete(sent, [])


def _exchange(reply: Completion) -> dict[str, Any]:
    return {
        "reply": reply.content,
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
    }


def _unreachable(exc: Exception) -> bool:
    """No answer, or one saying the server is overloaded or broken (429, 5xx)."""
    if not isinstance(exc, LLMError):
        return False
    return transient(exc.details.get("status") if isinstance(exc.details, dict) else None)


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, AppError) else f"{type(exc).__name__}: {exc}"
