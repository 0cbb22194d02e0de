"""An instant sandbox host and an instant scripted model, for bench/scale.py's workers.

A measurement harness, not a test double: with these a real worker process runs its
whole control-plane path (claim, lease, renewals, one transaction per step, live
events, artifacts, the experiment and reaping chores) while the sandbox answers every
command at once and the model answers every turn at once, so what is loaded is Postgres,
Redis and the API, never Docker or a model.

`StandInHost` answers everything the worker asks its Docker host: `ping` (start and
readiness), `has_image` and the image inspect of the inventory, `create_sandbox`,
`remove_container`, and the container and volume listings of the reaper (empty: no
container ever exists). `StandInSandbox` answers `exec` and `shell` with exit 0 and one
line of output (sent live, as a command's output is), and `collect` with `answer.txt`
(`ANSWER`: the task's answer, which an experiment item's scorer scores) and a result
file, stored as the task's artifacts.

`InstantModel` plays a model name `scale-K`: K-1 `execute_bash` turns of `true`, then
`submit` (the turn is picked by the assistant messages already in the history, as the
scripted server does), each with one streamed text fragment.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

import aiodocker

from app.agent.types import (
    Completion,
    DeltaCallback,
    ExecResult,
    Message,
    OutputCallback,
    ToolCall,
    ToolSchema,
)
from app.config import Settings
from app.llm.transport import shared_http_client
from app.runner.episode import EpisodeResult, Runner
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.files import CollectCaps, Collected, CollectedFile
from app.sandbox.policy import SandboxConfig
from app.scripted import Script, Turn
from app.specs import TaskSpec

MODEL_PREFIX = "scale-"
OUTPUT = b"ok\n"
ANSWER = b"42"
"""What every task's answer.txt holds: bench/scale.py's experiment rows expect it, so the
experiments' `exact` scorer scores every item 1."""
RESULT_BYTES = 2048
"""The size of the second artifact every task stores (besides answer.txt)."""


class _Containers:
    async def list(self, **_: object) -> list[object]:
        return []


class _Volumes:
    async def list(self, **_: object) -> dict[str, list[object]]:
        return {"Volumes": []}


class _Images:
    async def inspect(self, name: str) -> dict[str, str]:
        return {"Id": name}


class _StandInAPI:
    """The part of aiodocker's client that `app.sandbox.reaper` and `app.sandbox.image`
    call through `DockerHost.api()`: listings (empty) and image inspects (present)."""

    def __init__(self) -> None:
        self.containers = _Containers()
        self.volumes = _Volumes()
        self.images = _Images()


class StandInHost(DockerHost):
    """A Docker host whose sandboxes live in this process and whose daemon always answers."""

    def __init__(self) -> None:
        super().__init__(exec_channel=False)
        self._api = _StandInAPI()
        self._made = 0

    def api(self) -> aiodocker.Docker:
        return cast(aiodocker.Docker, self._api)

    async def ping(self) -> None:
        return None

    async def has_image(self, name: str) -> bool:
        return True

    async def create_sandbox(self, config: SandboxConfig) -> DockerSandbox:
        self._made += 1
        return StandInSandbox(self, f"standin-{self._made}", config)

    async def list_sandboxes(self, labels: Mapping[str, str]) -> list[str]:
        return []

    async def remove_container(self, container_id: str) -> None:
        return None


class StandInSandbox(DockerSandbox):
    """A sandbox whose every command succeeds at once, printing one line."""

    def __init__(self, host: DockerHost, sandbox_id: str, config: SandboxConfig) -> None:
        # No container behind it: DockerSandbox's own state is never touched (every method
        # that would is overridden).
        self.id = sandbox_id
        self.config = config
        self._host = host

    async def exec(
        self,
        argv: Sequence[str],
        *,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
    ) -> ExecResult:
        if on_output is not None:
            await on_output("stdout", OUTPUT)
        return ExecResult(0, OUTPUT, b"")

    async def shell(
        self,
        session: str,
        command: str,
        *,
        workdir: str,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
    ) -> ExecResult | None:
        return await self.exec(["bash", "-c", command], on_output=on_output)

    async def put_files(self, dest_dir: str, files: Sequence[tuple[str, bytes]]) -> None:
        return None

    async def collect(self, src_dir: str, caps: CollectCaps) -> Collected:
        stamp = datetime.now(UTC).isoformat().encode()
        result = (stamp + b"\n") * (RESULT_BYTES // (len(stamp) + 1))
        files = [CollectedFile("answer.txt", ANSWER), CollectedFile("result.txt", result)]
        return Collected(files=files)

    async def remove(self) -> None:
        return None


class InstantModel:
    """A `ChatModel` playing a `Script` in process: no HTTP, no latency."""

    def __init__(self, script: Script) -> None:
        self._turns = list(script.turns)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        number = sum(1 for message in messages if message.get("role") == "assistant")
        turn = self._turns[min(number, len(self._turns) - 1)]
        content = turn.content or f"turn {number}"
        if on_delta is not None:
            await on_delta("text", content)
        arguments = dict(turn.arguments) if isinstance(turn.arguments, Mapping) else {}
        call = ToolCall(f"call_{number}", turn.tool or "submit", arguments, json.dumps(arguments))
        wire = {"name": call.name, "arguments": call.raw_arguments}
        message = {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": call.id, "type": "function", "function": wire}],
        }
        return Completion(message=message, content=content, tool_calls=(call,))


def script_for(model: str) -> Script:
    """`scale-K`: K-1 `execute_bash` turns of `true`, then `submit` (K at least 1)."""
    steps = int(model.removeprefix(MODEL_PREFIX)) if model.startswith(MODEL_PREFIX) else 1
    bash = Turn(tool="execute_bash", arguments={"command": "true"})
    return Script(turns=[*[bash] * max(steps - 1, 0), Turn(tool="submit")])


class StandInRunner(Runner):
    """A runner whose episodes play `InstantModel` (the task's model name picks the script)."""

    async def run(self, spec: TaskSpec, problem: str, *args: Any, **kwargs: Any) -> EpisodeResult:
        kwargs.setdefault("model", InstantModel(script_for(spec.llm.model)))
        return await super().run(spec, problem, *args, **kwargs)


@asynccontextmanager
async def open_standin_runner(
    settings: Settings, *, warm_labels: Mapping[str, str] | None = None
) -> AsyncIterator[Runner]:
    """`app.runner.episode.open_runner` over `StandInHost`, without a warm pool (a start is
    free)."""
    async with StandInHost() as host, shared_http_client() as http:
        runner = StandInRunner(settings, host, http=http, remove_in_background=True)
        try:
            yield runner
        finally:
            await runner.drain()
