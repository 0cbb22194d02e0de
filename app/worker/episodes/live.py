"""One open episode in a worker: the service's own agent loop, with the trainer as its model.

The loop (`app.agent.loop` through `Runner.play`) runs unchanged; its model is a
`TrainerModel` whose `complete` hands the loop's history out and waits for the
trainer's next assistant message. So the messages a trainer gets are, by
construction, those the loop would send a model: the same prompt building, tool
semantics, Steps Remaining suffix and nudges, and the same sandbox, collection and
removal at the end.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from app.agent.tools import tool_schemas
from app.agent.types import (
    Completion,
    DeltaCallback,
    Message,
    Outcome,
    Resume,
    Step,
    ToolSchema,
    Usage,
)
from app.errors import SandboxError
from app.llm.openai import parse_completion
from app.runner.episode import EpisodeResult, Runner
from app.sandbox import snapshot
from app.sandbox.docker import DockerSandbox
from app.sandbox.reaper import CREATED_LABEL, INSTANCE_LABEL, WORKER_LABEL
from app.services.episodes.service import Opening
from app.states import FinishReason

EPISODE_LABEL = "sandhive.episode"
INFRASTRUCTURE_ENDS = frozenset({FinishReason.sandbox_error, FinishReason.worker_lost})


class TrainerModel:
    """A `ChatModel` answered by the trainer: each call publishes the history and waits."""

    def __init__(self) -> None:
        self.history: list[Message] = []
        self.asked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.inbox: asyncio.Queue[Completion] = asyncio.Queue(maxsize=1)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        assert isinstance(messages, list)
        self.history = messages  # the loop's own list: its later appends show here
        if not self.asked.done():
            self.asked.set_result(None)
        return await self.inbox.get()


class _Sink:
    """Steps are the trainer's to keep: nothing is stored per step in the service."""

    async def step_started(self, index: int) -> None:
        return None

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        return None

    async def live(self, kind: str, data: Any) -> None:
        return None


@dataclass(frozen=True)
class ForkPoint:
    """An open episode between two steps, as its children start from it: the history as
    its trainer was last handed it, the steps taken, and its sandbox's writable files."""

    messages: list[Message]
    steps: list[Step]
    usage: Usage
    files: bytes

    @property
    def index(self) -> int:
        """The step the children take next (the parent's next step too)."""
        return len(self.steps)


class LiveEpisode:
    def __init__(
        self,
        runner: Runner,
        opening: Opening,
        worker: str,
        instance: str,
        fork: ForkPoint | None = None,
    ) -> None:
        self.id = opening.id
        self.spec = opening.spec
        self.opening = opening
        created = datetime.now(UTC).replace(microsecond=0).isoformat()
        labels = {
            INSTANCE_LABEL: instance,
            WORKER_LABEL: worker,
            CREATED_LABEL: created,
            EPISODE_LABEL: opening.id,  # no task label: only its worker's death dooms it
        }
        self.episode = runner.episode(
            opening.spec, opening.prompt, labels=labels, inputs=opening.inputs
        )
        self.runner = runner
        self.model = TrainerModel()
        self.outcome = Outcome(finish_reason=FinishReason.max_steps)
        self.resume: Resume | None = None
        if fork is not None:  # a child: its parent's files instead of the inputs, and history
            self.episode = replace(self.episode, inputs=(), snapshot=snapshot.Unpack(fork.files))
            self.outcome.steps = copy.deepcopy(fork.steps)
            self.outcome.usage = replace(fork.usage)
            self.resume = Resume(fork.messages, fork.index)
        self.box: DockerSandbox | None = None
        """The sandbox while it runs (a fork's snapshot is taken from it)."""
        self.stop = asyncio.Event()
        self.lock = asyncio.Lock()
        self.last_active = time.monotonic()
        self.run: asyncio.Task[EpisodeResult] | None = None
        self.result: EpisodeResult | None = None

    @property
    def done(self) -> bool:
        return self.run is not None and self.run.done()

    async def start(self) -> dict[str, Any]:
        """Create the sandbox and run the loop up to its first model call."""
        self.run = asyncio.create_task(
            self.runner.play(
                self.episode,
                self.model,
                _Sink(),
                stop=self.stop,
                outcome=self.outcome,
                on_sandbox=self._sandbox,
                synchronous_sandbox=True,
                resume=self.resume,
            )
        )
        await self._asked_or_ended()
        tools = tool_schemas(self.spec.tools.profile, self.spec.tools.shell)
        if self.run.done():
            return self._ended({"messages": [], "tools": tools})
        return {"messages": copy.deepcopy(self.model.history), "tools": tools, "done": False}

    async def step(self, message: dict[str, Any]) -> dict[str, Any]:
        """Give the loop the trainer's turn; what it appended after it, up to its next call."""
        started = time.monotonic()
        self.last_active = started
        assert self.run is not None
        completion = parse_completion({"choices": [{"message": message}]})
        mark = len(self.model.history) + 1  # after the assistant message the trainer keeps
        self.model.asked = asyncio.get_running_loop().create_future()
        steps_before = len(self.outcome.steps)
        await self.model.inbox.put(completion)
        await self._asked_or_ended()
        self.last_active = time.monotonic()
        new = self.outcome.steps[steps_before:]
        reply: dict[str, Any] = {
            "messages": copy.deepcopy(self.model.history[mark:]),
            "timings": {
                "tool_ms": sum(s.tool_ms or 0 for s in new),
                "worker_ms": int((time.monotonic() - started) * 1000),
            },
        }
        if self.run.done():
            return self._ended(reply)
        return {**reply, "done": False}

    def _sandbox(self, box: DockerSandbox | None) -> None:
        self.box = box

    async def fork_point(self, max_bytes: int) -> ForkPoint:
        """What children of this episode start from, now: call it with the lock held, the
        loop waiting for the trainer's next turn (no tool runs while the files are read).
        `snapshot.SnapshotTooLarge` past `max_bytes`."""
        assert not self.done, "an ended episode has no sandbox to fork"
        if self.box is None:
            raise SandboxError("the episode's sandbox is not running")
        files = await snapshot.take(self.box, max_bytes)
        self.last_active = time.monotonic()
        return ForkPoint(
            messages=copy.deepcopy(self.model.history),
            steps=copy.deepcopy(self.outcome.steps),
            usage=replace(self.outcome.usage),
            files=files,
        )

    async def _asked_or_ended(self) -> None:
        """Until the loop calls its model again or ends."""
        assert self.run is not None
        waiters: list[asyncio.Future[Any]] = [self.run, self.model.asked]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)

    def _ended(self, reply: dict[str, Any]) -> dict[str, Any]:
        assert self.run is not None
        self.result = self.run.result()
        reason = self.outcome.finish_reason
        infra = reason in INFRASTRUCTURE_ENDS
        return {
            **reply,
            "done": True,
            "finish_reason": reason.value,
            "error": self.outcome.error,
            "error_kind": "infrastructure" if infra else None,
        }

    def answer(self, max_bytes: int) -> str | None:
        return self.result.answer(max_bytes) if self.result is not None else None

    async def close(self) -> None:
        """End the loop (if it still runs), collect, remove the sandbox."""
        self.stop.set()
        if self.run is not None:
            await asyncio.gather(self.run, return_exceptions=True)
            if self.result is None and not self.run.cancelled() and self.run.exception() is None:
                self.result = self.run.result()
