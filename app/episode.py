"""One episode: a fresh sandbox, a model and the agent loop, from inputs to collected outputs.

Shared by the worker and `sandhive run`, so both run exactly the same code path.
Knows nothing of Postgres or Redis; whoever calls it decides where steps and
files go (through the EventSink and the returned files).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from app import metrics
from app.agent.loop import run_agent
from app.agent.types import AgentSpec, ChatModel, EventSink, Outcome
from app.config import Settings
from app.errors import InvalidInput, SandboxError
from app.llm.profiles import HTTPChatModel, model_for_profile
from app.prompt_configs import render_prompts
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.files import CollectCaps, CollectedFile
from app.sandbox.policy import EgressPolicy, SandboxCaps, SandboxConfig, sandbox_config
from app.sandbox.pool import WarmPool
from app.schemas import LimitsSpec, LLMSpec, PromptSpec, SandboxSpec, ToolsOptions
from app.states import FinishReason, timeout_error

ANSWER_FILE = "answer.txt"
FIRST = asyncio.FIRST_COMPLETED
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Episode:
    agent: AgentSpec
    sandbox: SandboxConfig
    inputs: Sequence[tuple[str, bytes]] = ()
    input_dir: str = "/testbed/input"
    output_dir: str = "/testbed/output"
    collect_grace_s: float = 5.0
    """Time the output collection still gets when the loop used up the task's wall clock
    (`artifact_collect_grace_s`, filled in by `build_episode`)."""


@dataclass
class EpisodeResult:
    outcome: Outcome
    files: list[CollectedFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def answer(self, max_bytes: int) -> str | None:
        """The text of output/answer.txt, capped, or None when the agent wrote none."""
        for item in self.files:
            if item.path == ANSWER_FILE:
                return item.content[:max_bytes].decode("utf-8", errors="replace")
        return None


def build_episode(
    settings: Settings,
    prompt: PromptSpec,
    problem: str,
    *,
    limits: LimitsSpec,
    tools: ToolsOptions,
    sandbox: SandboxSpec,
    labels: Mapping[str, str],
    inputs: Sequence[tuple[str, bytes]] = (),
) -> Episode:
    """A task's episode from its resolved options: one mapping for the worker and `sandhive
    run`, and the sandbox choices pass the server's allow-list (`sandbox_config`) here."""
    workdir = settings.sandbox_workdir
    system, user = render_prompts(prompt, problem)
    return Episode(
        agent=AgentSpec(
            system_prompt=system,
            user_prompt=user,
            max_steps=limits.max_steps,
            timeout_s=limits.timeout_s,
            command_timeout_s=limits.command_timeout_s,
            max_context_tokens=limits.max_context_tokens,
            tools_profile=tools.profile,
            tools_shell=tools.shell,
            workdir=workdir,
            answer_all_tool_calls=tools.answer_all_tool_calls,
        ),
        sandbox=sandbox_config(
            sandbox_caps(settings),
            labels=labels,
            cpus=sandbox.cpus,
            memory_mb=sandbox.memory_mb,
            disk_mb=sandbox.disk_mb,
            network=sandbox.network,
            workdir=workdir,
        ),
        inputs=inputs,
        input_dir=prompt.input_dir,
        output_dir=prompt.output_dir,
        collect_grace_s=settings.artifact_collect_grace_s,
    )


def collect_caps(settings: Settings) -> CollectCaps:
    return CollectCaps(
        max_files=settings.artifact_max_files,
        max_file_bytes=settings.artifact_max_file_bytes,
        max_total_bytes=settings.artifact_max_total_bytes,
    )


def sandbox_caps(settings: Settings) -> SandboxCaps:
    """The server's sandbox policy: what tasks may choose within, and the fixed knobs."""
    egress = None
    if settings.sandbox_egress_enabled:
        egress = EgressPolicy(
            network=settings.sandbox_egress_network,
            bridge=settings.sandbox_egress_bridge,
            allow=tuple(settings.sandbox_egress_allow),
            manage_firewall=settings.sandbox_egress_firewall,
        )
    return SandboxCaps(
        image=settings.sandbox_image,
        max_cpus=settings.max_cpus,
        max_memory_mb=settings.max_memory_mb,
        max_disk_mb=settings.max_disk_mb,
        pids_limit=settings.sandbox_pids_limit,
        scratch_mb=settings.sandbox_scratch_mb,
        read_only_rootfs=settings.sandbox_read_only_rootfs,
        egress=egress,
        ca_bundle=str(settings.sandbox_ca_bundle) if settings.sandbox_ca_bundle else None,
    )


def chat_model_for(
    settings: Settings, llm: LLMSpec, client: httpx.AsyncClient | None = None
) -> HTTPChatModel:
    """The model client for a task's resolved LLM spec: the profile's kind, URL and key.

    `client`: the process's shared HTTP client, if it has one (the worker does).
    """
    profile = settings.llm_profiles().get(llm.profile)
    if profile is None:
        raise InvalidInput(f"unknown LLM profile {llm.profile!r}")
    return model_for_profile(
        profile,
        model=llm.model,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens_per_call,
        extra_body=llm.extra_body,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        backoff_s=settings.llm_retry_backoff_s,
        client=client,
    )


async def run_episode(
    host: DockerHost,
    model: ChatModel,
    episode: Episode,
    sink: EventSink,
    caps: CollectCaps,
    stop: asyncio.Event | None = None,
    pool: WarmPool | None = None,
    used_s: float = 0.0,
) -> EpisodeResult:
    """Create the sandbox, run the loop, collect /testbed/output, always remove the sandbox.

    The task's wall clock (`agent.timeout_s`) covers all of it: the sandbox start,
    the loop and the collection (which still gets `collect_grace_s` after a timeout,
    so partial output is kept). It is the task's, not the attempt's: `used_s` is
    what earlier attempts already spent of it (since the first one started), and
    this one gets the rest. Setting `stop` ends the loop at once (a cancel);
    the output so far is still collected. With a warm `pool`, a ready sandbox of the
    same shape is used when there is one (it is removed afterwards all the same).
    The wait for a sandbox ready to run (inputs in place) is recorded, warm or cold.
    """
    box: DockerSandbox | None = None
    result = EpisodeResult(outcome=Outcome(finish_reason=FinishReason.sandbox_error))
    deadline = _Deadline(episode.agent.timeout_s, used_s)
    try:
        async with asyncio.timeout(deadline.left()):
            asked = time.monotonic()
            box = pool.claim(episode.sandbox) if pool is not None else None
            warm = box is not None
            box = box or await host.create_sandbox(episode.sandbox)
            if episode.inputs:
                await box.put_files(episode.input_dir, episode.inputs)
            metrics.observe_sandbox_start(time.monotonic() - asked, warm=warm)
        agent = replace(episode.agent, timeout_s=deadline.left())
        result.outcome = await _run_until_stopped(run_agent(agent, box, model, sink), stop)
        if result.outcome.finish_reason is FinishReason.timeout:  # the limit, not what was left
            result.outcome.error = timeout_error(episode.agent.timeout_s)
        async with asyncio.timeout(deadline.left(at_least=episode.collect_grace_s)):
            collected = await box.collect(episode.output_dir, caps)
        result.files, result.skipped = collected.files, collected.skipped
    except SandboxError as exc:
        result.outcome.finish_reason = FinishReason.sandbox_error
        result.outcome.error = exc.message
    except TimeoutError:
        result.outcome.finish_reason = FinishReason.timeout
        result.outcome.error = timeout_error(episode.agent.timeout_s)
    finally:
        if box is not None:
            await _remove_quietly(box)
    return result


class _Deadline:
    """The task's wall clock: what is left of `timeout_s` once `used_s` is spent (None: no limit).

    Monotonic from the episode's start on; `used_s` (earlier attempts, read from
    Postgres timestamps) is the only wall-clock part.
    """

    def __init__(self, timeout_s: float | None, used_s: float = 0.0) -> None:
        self._at = None if timeout_s is None else time.monotonic() + timeout_s - used_s

    def left(self, at_least: float = 0.0) -> float | None:
        return None if self._at is None else max(self._at - time.monotonic(), at_least)


async def _run_until_stopped(
    loop: Coroutine[Any, Any, Outcome], stop: asyncio.Event | None
) -> Outcome:
    """The loop's outcome, or `cancelled` as soon as `stop` is set (the loop is cancelled)."""
    agent = asyncio.ensure_future(loop)
    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        await asyncio.wait([t for t in (agent, stopped) if t is not None], return_when=FIRST)
    finally:
        for pending in (agent, stopped):
            if pending is not None and not pending.done():
                pending.cancel()
        # The loop's cleanup (killing a running command) finishes before the sandbox goes.
        await asyncio.gather(agent, return_exceptions=True)
    if agent.cancelled():
        return Outcome(finish_reason=FinishReason.cancelled, error="cancelled")
    return agent.result()


async def _remove_quietly(box: DockerSandbox) -> None:
    """A failed removal must not replace the episode's result; the container stays labelled."""
    try:
        await box.remove()
    except SandboxError:
        log.warning("could not remove sandbox %s; it stays labelled for cleanup", box.id)
