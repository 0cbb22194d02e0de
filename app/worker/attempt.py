"""Run one attempt of one task: start it, run the episode, store outputs, finish it.

`run_attempt` never raises: every failure becomes a finished task (or, for an
attempt that another worker took over, nothing at all), because an exception
escaping into the pool's TaskGroup would cancel sibling attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from app import logs
from app.agent.types import Action, EventSink, Outcome, Step
from app.errors import AppError, InvalidInput, LLMError, SandboxError
from app.ids import utc_now
from app.kit import outage
from app.runner.episode import EpisodeResult
from app.runner.replay import RecordedTurn, ReplayModel
from app.sandbox import reaper
from app.schemas.tasks import UsageOut
from app.services.tasks import attempts
from app.services.tasks import forks as task_forks
from app.services.tasks.attempts import StaleAttempt, StartedAttempt
from app.services.tasks.lifecycle import TaskEnd
from app.specs import ForkSpec
from app.states import FinishReason
from app.worker.context import WorkerContext
from app.worker.running import End, Running, StopReason
from app.worker.sandboxes.builds import Builder
from app.worker.sink import TaskSink
from app.worker.snapshots import SnapshottingSink

log = logging.getLogger(__name__)


async def run_attempt(ctx: WorkerContext, running: Running, builder: Builder | None = None) -> End:
    """Run the task if it still needs running; say how the worker is done with its message.
    `builder`: builds a tenant's own image this worker lacks (none: such a task fails)."""
    try:
        started = await attempts.start_attempt(
            ctx.sessions,
            ctx.redis,
            running.task_id,
            ctx.name,
            max_attempts=ctx.settings.worker_max_attempts,
        )
    except Exception:
        log.exception("could not start %s; it will be retried", running.task_id)
        return End.retry
    if started is None:
        return End.done
    running.attempt = started.attempt
    logs.bind(attempt=started.attempt, tenant=started.tenant)
    log.info("attempt %d of %s started", started.attempt, started.task_id)
    try:
        return await _run_started(ctx, running, started, builder)
    except StaleAttempt:
        log.warning("attempt %s of %s was taken over", started.attempt, started.task_id)
        return End.stale
    except Exception:  # even finishing failed (Postgres down): another attempt will run it
        log.exception("attempt %s of %s could not be recorded", started.attempt, started.task_id)
        return End.retry


async def _run_started(
    ctx: WorkerContext, running: Running, started: StartedAttempt, builder: Builder | None
) -> End:
    """Raises StaleAttempt when a newer attempt owns the task; nothing else."""
    await _remove_earlier_sandboxes(ctx, started)
    sink = TaskSink(ctx.sessions, ctx.redis, started.task_id, started.attempt)
    outcome = Outcome(FinishReason.max_steps)  # the one record of steps and usage
    expiring = asyncio.create_task(_announce_expiry(ctx, started))
    try:
        if await _own_image(started, builder, running.stop):
            result = await _run(ctx, started, sink, running, outcome)
        else:  # stopped while its image was built: as a cancel of the loop would end
            outcome.finish_reason, outcome.error = FinishReason.cancelled, "cancelled"
            result = EpisodeResult(outcome)
    except StaleAttempt:
        raise
    except Exception as exc:  # the attempt must end in a terminal state whatever happened
        if (backend := outage.backend_down(exc)) is not None:
            # Not the task's fault: it runs again as a new attempt once the backend is back.
            log.warning("attempt %s/%s lost %s: it will run again", *_ids(started), backend)
            return End.retry
        log.exception("attempt %s/%s crashed", started.task_id, started.attempt)
        end = TaskEnd(_reason_for(exc), usage=_usage(outcome), error=_describe(exc))
        await attempts.finish_task(ctx.sessions, ctx.redis, started.task_id, started.attempt, end)
        return End.done
    finally:
        expiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiring  # never left writing while the attempt ends
    if running.reason is StopReason.lease_lost:
        log.warning("attempt %d of %s lost its lease; stopped", started.attempt, started.task_id)
        return End.stale
    if running.reason is StopReason.hand_back and _was_stopped(result):
        await attempts.hand_back(ctx.sessions, ctx.redis, started.task_id, started.attempt)
        return End.hand_back
    try:
        await _store(ctx, started, result)
    except StaleAttempt:
        raise
    except Exception as exc:  # e.g. an output Postgres refuses: finish without the outputs
        log.exception("outputs of %s/%s could not be stored", started.task_id, started.attempt)
        error = f"the task's outputs could not be stored: {_describe(exc)}"
        end = TaskEnd(FinishReason.sandbox_error, usage=_usage(outcome), error=error)
        await attempts.finish_task(ctx.sessions, ctx.redis, started.task_id, started.attempt, end)
    return End.done


async def _own_image(started: StartedAttempt, builder: Builder | None, stop: asyncio.Event) -> bool:
    """A tenant's own image is built here first when this worker lacks it (SandboxError when
    it cannot be: the task then fails `sandbox_error`, retried by an experiment); False when
    a cancel or a hand-back came first (the build is dropped: the next asker builds it)."""
    spec = started.spec
    built = spec.sandbox.built
    if built is None or (spec.mode == "vanilla" and spec.verifier is None):
        return True
    if builder is None:
        raise SandboxError(f"image built/{built.name} cannot be built by this worker")
    building = asyncio.ensure_future(
        builder.ensure(started.tenant, built.model_dump(), spec.sandbox.image)
    )
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([building, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (building, stopped):
            pending.cancel()
    if building.done() and not building.cancelled():
        building.result()  # raises what the build raised
        return True
    return False


async def _run(
    ctx: WorkerContext,
    started: StartedAttempt,
    sink: TaskSink,
    running: Running,
    outcome: Outcome,
) -> EpisodeResult:
    labels = reaper.labels_for(ctx.instance, started.task_id, started.attempt, ctx.name)
    spec = started.spec
    loop_sink: EventSink = sink
    if spec.sandbox.snapshots == "steps" and spec.mode == "sandbox":
        max_bytes = ctx.settings.snapshot_max_mb * 2**20
        loop_sink = SnapshottingSink(
            sink, running, ctx.sessions, started.task_id, started.attempt, max_bytes
        )
    replay: ReplayModel | None = None
    fork: dict[str, Any] = {}
    try:
        if spec.fork is not None and spec.fork.rebuild == "snapshot" and spec.fork.step > 0:
            fork = await _from_snapshot(ctx, spec.fork, sink)
        elif spec.fork is not None:
            replay = await _replay(ctx, started, spec.fork)
        result = await ctx.runner.run(
            spec,
            started.prompt,
            loop_sink,
            labels=labels,
            inputs=started.inputs,
            stop=running.stop,
            used_s=started.used_s,  # what earlier attempts ran of timeout_s
            outcome=outcome,
            session=started.task_id,
            on_sandbox=running.hold,
            model=replay,
            **fork,
        )
        await sink.flush()  # every step stored (or StaleAttempt) before the task is finished
        if replay is not None and replay.divergence is not None and replay.allow_divergence:
            result.diverged = replay.divergence.as_json()
        return result
    finally:
        await sink.close()
        if replay is not None:
            await replay.close()


async def _replay(ctx: WorkerContext, started: StartedAttempt, fork: ForkSpec) -> ReplayModel:
    """A fork's model: its parent's recorded steps played again, then its own model."""
    steps = await task_forks.recorded_steps(ctx.sessions, fork)
    model = ctx.runner.model(started.spec.llm, started.task_id)
    turns = [RecordedTurn(step.message, step.observation) for step in steps]
    return ReplayModel(turns, model, allow_divergence=fork.allow_divergence)


async def _from_snapshot(ctx: WorkerContext, fork: ForkSpec, sink: TaskSink) -> dict[str, Any]:
    """A fork from its parent's snapshot: the parent's steps before the branch stored as the
    child's first (nothing of them runs again), then `Runner.run` unpacks the files and goes
    on after them."""
    steps = await task_forks.recorded_steps(ctx.sessions, fork)
    archive = await task_forks.snapshot_of(ctx.sessions, fork)
    await sink.step_started(0)
    for at, step in enumerate(steps):
        following = at + 1 if at + 1 < len(steps) else None
        await sink.step_completed(_as_step(step), following)
    turns = [RecordedTurn(step.message, step.observation) for step in steps]
    return {"snapshot": archive, "resume_from": turns}


def _as_step(step: task_forks.RecordedStep) -> Step:
    action = step.action
    return Step(
        index=step.index,
        started_at=step.started_at,
        thought=step.thought,
        reasoning=step.reasoning,
        action=Action(action["tool"], action["arguments"]) if action is not None else None,
        observation=step.observation,
        exit_code=step.exit_code,
        llm_ms=step.llm_ms,
        tool_ms=step.tool_ms,
        prompt_tokens=step.prompt_tokens,
        completion_tokens=step.completion_tokens,
        message=step.message,
    )


async def _announce_expiry(ctx: WorkerContext, started: StartedAttempt) -> None:
    """`task.expiring`, `webhook_expiring_lead_s` before the attempt's share of
    `limits.timeout_s` runs out (at once if less is left); cancelled when the attempt ends.
    Never raises: a webhook that could not be written must not end the attempt."""
    lead = ctx.settings.webhook_expiring_lead_s
    if lead <= 0:
        return
    left = max(started.spec.limits.timeout_s - started.used_s, 0.0)
    expires_at = utc_now() + timedelta(seconds=left)
    await asyncio.sleep(max(left - lead, 0.0))
    try:
        await attempts.task_expiring(ctx.sessions, started.task_id, started.attempt, expires_at)
    except Exception as exc:
        log.warning("task.expiring of %s could not be written: %r", started.task_id, exc)


async def _remove_earlier_sandboxes(ctx: WorkerContext, started: StartedAttempt) -> None:
    """A new attempt gets a new sandbox; a lost attempt's one (on this host) goes first."""
    if started.attempt == 1:
        return
    try:
        await reaper.remove_earlier_attempts(
            ctx.docker, ctx.instance, started.task_id, started.attempt
        )
    except SandboxError as exc:
        log.warning("could not remove earlier sandboxes of %s: %s", started.task_id, exc)


async def _store(ctx: WorkerContext, started: StartedAttempt, result: EpisodeResult) -> None:
    outcome = result.outcome
    files = [(item.path, item.content) for item in result.files]
    await attempts.finish_task(
        ctx.sessions,
        ctx.redis,
        started.task_id,
        started.attempt,
        TaskEnd(
            outcome.finish_reason,
            answer=result.answer(ctx.settings.answer_max_bytes),
            usage=_usage(outcome),
            error=outcome.error,
            verification=result.verification,
            diverged=result.diverged,
        ),
        files,
        skipped=result.skipped,
    )


def _ids(started: StartedAttempt) -> tuple[str, int]:
    return started.task_id, started.attempt


def _usage(outcome: Outcome) -> UsageOut:
    return UsageOut(**asdict(outcome.usage))


def _was_stopped(result: EpisodeResult) -> bool:
    return result.outcome.finish_reason is FinishReason.cancelled


def _reason_for(exc: Exception) -> FinishReason:
    """A model or model-configuration failure is the LLM's; anything else the sandbox's."""
    if isinstance(exc, LLMError | InvalidInput):
        return FinishReason.llm_error
    return FinishReason.sandbox_error


def _describe(exc: Exception) -> str:
    if isinstance(exc, AppError):
        return exc.message
    return f"internal error: {type(exc).__name__}"
