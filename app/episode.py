"""One episode: a fresh sandbox, a model and the agent loop, from inputs to collected outputs.

Shared by the worker and `sandhive run`, so both run exactly the same code path.
Knows nothing of Postgres or Redis; whoever calls it decides where steps and
files go (through the EventSink and the returned files).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.agent.loop import run_agent
from app.agent.types import AgentSpec, ChatModel, EventSink, Outcome
from app.config import Settings
from app.errors import InvalidInput, SandboxError
from app.llm.openai import OpenAIChatModel
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.files import CollectCaps, CollectedFile
from app.sandbox.policy import SandboxConfig
from app.schemas import LLMSpec
from app.states import FinishReason

ANSWER_FILE = "answer.txt"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Episode:
    agent: AgentSpec
    sandbox: SandboxConfig
    inputs: Sequence[tuple[str, bytes]] = ()
    input_dir: str = "/testbed/input"
    output_dir: str = "/testbed/output"


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


def collect_caps(settings: Settings) -> CollectCaps:
    return CollectCaps(
        max_files=settings.artifact_max_files,
        max_file_bytes=settings.artifact_max_file_bytes,
        max_total_bytes=settings.artifact_max_total_bytes,
    )


def chat_model_for(settings: Settings, llm: LLMSpec) -> OpenAIChatModel:
    """The model client for a task's resolved LLM spec, with the server-side profile's key."""
    profile = settings.llm_profiles().get(llm.profile)
    if profile is None:
        raise InvalidInput(f"unknown LLM profile {llm.profile!r}")
    return OpenAIChatModel(
        base_url=profile.base_url,
        api_key=profile.api_key.get_secret_value(),
        model=llm.model,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens_per_call,
        extra_body=llm.extra_body,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        backoff_s=settings.llm_retry_backoff_s,
    )


async def run_episode(
    host: DockerHost, model: ChatModel, episode: Episode, sink: EventSink, caps: CollectCaps
) -> EpisodeResult:
    """Create the sandbox, run the loop, collect /testbed/output, always remove the sandbox."""
    box: DockerSandbox | None = None
    result = EpisodeResult(outcome=Outcome(finish_reason=FinishReason.sandbox_error))
    try:
        box = await host.create_sandbox(episode.sandbox)
        if episode.inputs:
            await box.put_files(episode.input_dir, episode.inputs)
        result.outcome = await run_agent(episode.agent, box, model, sink)
        collected = await box.collect(episode.output_dir, caps)
        result.files, result.skipped = collected.files, collected.skipped
    except SandboxError as exc:
        result.outcome.finish_reason = FinishReason.sandbox_error
        result.outcome.error = exc.message
    finally:
        if box is not None:
            await _remove_quietly(box)
    return result


async def _remove_quietly(box: DockerSandbox) -> None:
    """A failed removal must not replace the episode's result; the container stays labelled."""
    try:
        await box.remove()
    except SandboxError:
        log.warning("could not remove sandbox %s; it stays labelled for cleanup", box.id)
