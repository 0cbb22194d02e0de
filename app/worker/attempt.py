"""Run one attempt of one task: start it, run the episode, store outputs, finish it.

`run_attempt` never raises: every failure becomes a finished task, because an
exception escaping into the pool's TaskGroup would cancel sibling attempts.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.agent.prompts import render_prompts
from app.agent.types import AgentSpec
from app.config import Settings
from app.episode import Episode, EpisodeResult, chat_model_for, collect_caps, run_episode
from app.errors import AppError, InvalidInput, LLMError
from app.sandbox.docker import DockerHost
from app.sandbox.policy import SandboxConfig
from app.schemas import UsageOut
from app.services import attempts
from app.services.attempts import StartedAttempt
from app.states import FinishReason
from app.worker.sink import TaskSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    redis: Redis
    docker: DockerHost
    name: str


async def run_attempt(ctx: WorkerContext, task_id: str) -> None:
    """Run the task if it still needs running; always leave it finished."""
    started = await attempts.start_attempt(ctx.sessions, ctx.redis, task_id, ctx.name)
    if started is None:
        return
    try:
        result = await _run(ctx, started)
    except Exception as exc:  # the attempt must end in a terminal state whatever happened
        log.exception("attempt %s/%s crashed", task_id, started.attempt)
        await _finish_failed(ctx, task_id, _reason_for(exc), _describe(exc))
        return
    await _store(ctx, task_id, result)


async def _run(ctx: WorkerContext, started: StartedAttempt) -> EpisodeResult:
    model = chat_model_for(ctx.settings, started.spec.llm)
    sink = TaskSink(ctx.sessions, ctx.redis, started.task_id, started.attempt)
    try:
        return await run_episode(
            ctx.docker, model, episode_for(ctx, started), sink, collect_caps(ctx.settings)
        )
    finally:
        await model.aclose()


def episode_for(ctx: WorkerContext, started: StartedAttempt) -> Episode:
    spec, workdir = started.spec, ctx.settings.sandbox_workdir
    system, user = render_prompts(
        spec.prompt_config,
        started.prompt,
        workdir=workdir,
        input_dir=f"{workdir}/input",
        output_dir=f"{workdir}/output",
    )
    labels = {
        "sandhive.task": started.task_id,
        "sandhive.attempt": str(started.attempt),
        "sandhive.worker": ctx.name,
    }
    return Episode(
        agent=AgentSpec(
            system_prompt=system,
            user_prompt=user,
            max_steps=spec.limits.max_steps,
            timeout_s=spec.limits.timeout_s,
            command_timeout_s=spec.limits.command_timeout_s,
            max_context_tokens=spec.limits.max_context_tokens,
            tools_profile=spec.tools.profile,
            workdir=workdir,
        ),
        sandbox=SandboxConfig(
            image=ctx.settings.sandbox_image,
            labels=labels,
            cpus=spec.sandbox.cpus,
            memory_mb=spec.sandbox.memory_mb,
            pids_limit=ctx.settings.sandbox_pids_limit,
            network=spec.sandbox.network,
            workdir=workdir,
        ),
        inputs=started.inputs,
        input_dir=f"{workdir}/input",
        output_dir=f"{workdir}/output",
    )


async def _store(ctx: WorkerContext, task_id: str, result: EpisodeResult) -> None:
    files = [(item.path, item.content) for item in result.files]
    await attempts.save_artifacts(ctx.sessions, ctx.redis, task_id, files)
    outcome = result.outcome
    await attempts.finish_task(
        ctx.sessions,
        ctx.redis,
        task_id,
        reason=outcome.finish_reason,
        answer=result.answer(ctx.settings.answer_max_bytes),
        usage=UsageOut(**asdict(outcome.usage)),
        error=outcome.error,
    )


async def _finish_failed(
    ctx: WorkerContext, task_id: str, reason: FinishReason, error: str
) -> None:
    await attempts.finish_task(
        ctx.sessions, ctx.redis, task_id, reason=reason, answer=None, usage=UsageOut(), error=error
    )


def _reason_for(exc: Exception) -> FinishReason:
    """A model or model-configuration failure is the LLM's; anything else the sandbox's."""
    if isinstance(exc, LLMError | InvalidInput):
        return FinishReason.llm_error
    return FinishReason.sandbox_error


def _describe(exc: Exception) -> str:
    if isinstance(exc, AppError):
        return exc.message
    return f"internal error: {type(exc).__name__}"
