"""A sandbox the loop can hold while it is still starting.

The loop's first model call needs no sandbox (the prompts are rendered without one), so
the runner starts the sandbox and the loop together: the model thinks while Docker
creates the container, and the first tool call waits for whatever of the start is left.
A cold task's first model request then goes out in milliseconds instead of after the
sandbox's few hundred, and a real model's first-token latency hides the start entirely.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from app.agent.types import ExecResult, OutputCallback, Sandbox

S = TypeVar("S", bound=Sandbox)


class PendingSandbox(Generic[S]):
    """An `app.agent.types.Sandbox` whose commands wait for `start` to finish.

    `start`'s failure is raised by the first command (a `SandboxError`, or `TimeoutError`
    past the task's deadline), so the loop ends as it would have. Waiting is shielded: a
    command cancelled while it waits (a cancel, the task's timeout) never cancels the start
    itself, whose sandbox the runner still owns and removes.
    """

    def __init__(self, start: asyncio.Future[S]) -> None:
        self.start = start

    async def ready(self) -> S:
        return await asyncio.shield(self.start)

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
        box = await self.ready()
        return await box.exec(
            argv,
            workdir=workdir,
            env=env,
            stdin=stdin,
            timeout_s=timeout_s,
            on_output=on_output,
            linger_s=linger_s,
        )

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
        box = await self.ready()
        return await box.shell(
            session,
            command,
            workdir=workdir,
            timeout_s=timeout_s,
            on_output=on_output,
            linger_s=linger_s,
        )
