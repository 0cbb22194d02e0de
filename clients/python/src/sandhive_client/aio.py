"""The asyncio client: `AsyncSandhive(base_url, api_key)`, the same calls as `Sandhive`, awaited.

`.tasks`, `.experiments`, `.sandboxes` and `.images`, as in `sandhive_client.client`, whose
docstrings say what each call does."""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from sandhive_client import _calls, errors
from sandhive_client._build import Context, Dockerfile, build_body
from sandhive_client._exec import StreamedExec
from sandhive_client._http import (
    Call,
    Retries,
    headers_of,
    may_resend,
    raise_for_error,
    retried,
    retry_after,
)
from sandhive_client._resume import Resume
from sandhive_client._sse import Frame, aframes
from sandhive_client._version import __version__
from sandhive_client.client import DEFAULT_TIMEOUT, STREAM_TIMEOUT, base_url_of
from sandhive_client.models import (
    ArtifactList,
    BatchResult,
    CommandPage,
    Event,
    ExecOutput,
    ExecResult,
    Experiment,
    ExperimentItem,
    ExperimentPage,
    FileList,
    FileWritten,
    Image,
    ImageBuild,
    SandboxInfo,
    SandboxPage,
    Task,
    TaskFork,
    TaskPage,
    Trajectory,
)

T = TypeVar("T")


class AsyncSandhive:
    """A Sandhive API, for asyncio. Use as `async with`, or `await close()` when done."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retries: Retries | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("SANDHIVE_API_KEY")
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._base = base_url_of(base_url)
        self._headers = headers_of(key, f"sandhive-client/{__version__}")
        self.retries = retries or Retries()
        self.tasks = AsyncTasks(self)
        self.experiments = AsyncExperiments(self)
        self.sandboxes = AsyncSandboxes(self)
        self.images = AsyncImages(self)

    async def __aenter__(self) -> AsyncSandhive:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def call(self, call: Call[T]) -> T:
        """Send `call`, retrying 429/503 (after Retry-After) and refused connections, bounded."""
        for attempt in range(self.retries.max_retries + 1):
            last = attempt == self.retries.max_retries
            try:
                response = await self._http.request(
                    call.method,
                    self._base + call.path,
                    params=call.params,
                    json=call.json,
                    content=call.content,
                    headers={**self._headers, **call.headers},
                    timeout=call.timeout_or(httpx.USE_CLIENT_DEFAULT),
                )
            except httpx.TransportError as exc:
                if last or not may_resend(call, exc):
                    raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
                await asyncio.sleep(self.retries.delay(attempt + 1, None))
                continue
            if retried(call, response.status_code) and not last:
                await asyncio.sleep(self.retries.delay(attempt + 1, retry_after(response)))
                continue
            raise_for_error(response, call.errors_by_reason)
            return call.read(response)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def events(self, call: Call[Any]) -> AsyncIterator[Frame]:
        """The Server-Sent Events `call` answers, as `Sandhive.events`."""
        for attempt in range(self.retries.max_retries + 1):
            last = attempt == self.retries.max_retries
            wait: float | None = None
            try:
                async with self._http.stream(
                    call.method,
                    self._base + call.path,
                    params=call.params,
                    json=call.json,
                    headers={**self._headers, **call.headers, "Accept": "text/event-stream"},
                    timeout=call.timeout_or(STREAM_TIMEOUT),
                ) as response:
                    if retried(call, response.status_code) and not last:
                        wait = self.retries.delay(attempt + 1, retry_after(response))
                    elif not response.is_success:
                        await response.aread()
                        raise_for_error(response, call.errors_by_reason)
                    else:
                        async for frame in aframes(response.aiter_lines()):
                            yield frame
                        return
            except httpx.TransportError as exc:
                raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
            await asyncio.sleep(wait or 0.0)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def stream(
        self, task_id: str, *, after: int = 0, reconnect_for_s: float = 60.0
    ) -> AsyncIterator[Event]:
        """The task's events from `after` on, until `task.finished`; resumed by seq after a
        dropped connection, as `Sandhive.stream`."""
        resume = Resume(task_id, after, reconnect_for_s)
        url = self._base + _calls.events_path(task_id)
        while True:
            cause: Exception | None = None  # None: the server ended the response early
            try:
                async with self._http.stream(
                    "GET", url, headers=resume.headers(self._headers), timeout=STREAM_TIMEOUT
                ) as response:
                    if response.status_code == 204:
                        return
                    if not response.is_success:
                        await response.aread()
                        raise_for_error(response)
                    async for frame in aframes(response.aiter_lines()):
                        if (event := resume.accept(frame)) is not None:
                            yield event
                            if event.type == "task.finished":
                                return
            except (httpx.TransportError, errors.RetryableError) as exc:
                cause = exc
            await asyncio.sleep(resume.pause(cause, self.retries.max_wait_s))


class AsyncTasks:
    """`client.tasks`, awaited; see `sandhive_client.client.Tasks`."""

    def __init__(self, client: AsyncSandhive) -> None:
        self._c = client
        self.artifacts = AsyncArtifacts(client)

    async def create(
        self, prompt: str, *, idempotency_key: str | None = None, **fields: Any
    ) -> Task:
        return await self._c.call(_calls.create_task(prompt, idempotency_key, fields))

    async def create_batch(self, tasks: Sequence[Mapping[str, Any]]) -> BatchResult:
        return await self._c.call(_calls.create_batch(tasks))

    async def get(self, task_id: str) -> Task:
        return await self._c.call(_calls.get_task(task_id))

    async def list(
        self,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        **filters: Any,
    ) -> TaskPage:
        return await self._c.call(_calls.list_tasks(status, limit, cursor, filters))

    async def cancel(self, task_id: str) -> Task:
        return await self._c.call(_calls.cancel_task(task_id))

    async def fork(self, task_id: str, step: int, *, n: int = 1, **fields: Any) -> TaskFork:
        """`n` new tasks that replay the task's steps before `step` in a fresh sandbox, then go
        on with a model (`llm=...` for another one; `allow_divergence`, `limits`:
        docs/fork.md)."""
        return await self._c.call(_calls.fork_task(task_id, step, n, fields))

    async def wait(
        self, task_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> Task:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            task = await self.get(task_id)
            if task.done:
                return task
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise errors.WaitTimeout(f"{task_id} is still {task.status} after {timeout_s} s")
            await asyncio.sleep(poll_s)

    async def trajectory(self, task_id: str, *, attempt: int | None = None) -> Trajectory:
        return await self._c.call(_calls.trajectory(task_id, attempt))

    def stream(
        self, task_id: str, *, after: int = 0, reconnect_for_s: float = 60.0
    ) -> AsyncIterator[Event]:
        return self._c.stream(task_id, after=after, reconnect_for_s=reconnect_for_s)


class AsyncArtifacts:
    def __init__(self, client: AsyncSandhive) -> None:
        self._c = client

    async def list(self, task_id: str) -> ArtifactList:
        return await self._c.call(_calls.list_artifacts(task_id))

    async def download(self, task_id: str, path: str) -> bytes:
        return await self._c.call(_calls.download_artifact(task_id, path))

    async def zip(self, task_id: str) -> bytes:
        return await self._c.call(_calls.artifacts_zip(task_id))


class AsyncExperiments:
    def __init__(self, client: AsyncSandhive) -> None:
        self._c = client

    async def create(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Experiment:
        return await self._c.call(_calls.create_experiment({**(spec or {}), **fields}))

    async def get(self, experiment_id: str) -> Experiment:
        return await self._c.call(_calls.get_experiment(experiment_id))

    async def list(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> ExperimentPage:
        return await self._c.call(_calls.list_experiments(status, limit, cursor))

    async def results(
        self, experiment_id: str, *, format: str | None = None, grading: int | None = None
    ) -> dict[str, Any]:
        return await self._c.call(_calls.experiment_results(experiment_id, format, grading))

    async def items(self, experiment_id: str) -> builtins.list[ExperimentItem]:
        return await self._c.call(_calls.experiment_items(experiment_id))

    async def cancel(self, experiment_id: str) -> Experiment:
        return await self._c.call(_calls.cancel_experiment(experiment_id))


class AsyncSandboxes:
    """`client.sandboxes`, awaited; see `sandhive_client.client.Sandboxes`."""

    def __init__(self, client: AsyncSandhive) -> None:
        self._c = client

    async def create(
        self,
        image: str = "default",
        *,
        ttl_s: int | None = None,
        metadata: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        network: str | None = None,
        allow_domains: Sequence[str] | None = None,
        read_only_rootfs: bool | None = None,
        **fields: Any,
    ) -> AsyncSandbox:
        body = {
            "image": image,
            "ttl_s": ttl_s,
            "metadata": dict(metadata) if metadata else None,
            "env": dict(env) if env else None,
            "cpus": cpus,
            "memory_mb": memory_mb,
            "disk_mb": disk_mb,
            "network": network,
            "allow_domains": list(allow_domains) if allow_domains is not None else None,
            "read_only_rootfs": read_only_rootfs,
            **fields,
        }
        return AsyncSandbox(self._c, await self._c.call(_calls.create_sandbox(body)))

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._c, await self._c.call(_calls.get_sandbox(sandbox_id)))

    async def list(
        self,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **filters: Any,
    ) -> SandboxPage:
        return await self._c.call(_calls.list_sandboxes(status, limit, cursor, metadata, filters))


class AsyncImages:
    """`client.images`, awaited; see `sandhive_client.client.Images`."""

    def __init__(self, client: AsyncSandhive) -> None:
        self._c = client

    async def list(self) -> builtins.list[Image]:
        return await self._c.call(_calls.list_images())

    async def build(
        self,
        name: str,
        dockerfile: Dockerfile,
        *,
        context: Context = None,
        build_args: Mapping[str, str] | None = None,
        description: str = "",
        timeout_s: float | None = _calls.BUILD_TIMEOUT_S,
    ) -> ImageBuild:
        """As `Images.build`; the context is read and packed in a thread."""
        body = await asyncio.to_thread(
            build_body, name, dockerfile, context, build_args, description
        )
        return await self._c.call(_calls.build_image(body, timeout_s))

    async def get_build(self, name: str) -> ImageBuild:
        return await self._c.call(_calls.get_build(name))

    async def list_builds(self) -> builtins.list[ImageBuild]:
        return await self._c.call(_calls.list_builds())

    async def delete_build(self, name: str) -> None:
        await self._c.call(_calls.delete_build(name))


class AsyncSandbox:
    """One sandbox, for asyncio; see `sandhive_client.client.Sandbox`. `async with` deletes
    it when the block ends."""

    def __init__(self, client: AsyncSandhive, info: SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.files = AsyncSandboxFiles(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.info.status}>"

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        body = _calls.exec_body(
            cmd,
            stdin=stdin,
            cwd=cwd,
            env=env,
            user=user,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )
        return await self._c.call(_calls.exec_command(self.id, body))

    async def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[ExecOutput | ExecResult]:
        body = _calls.exec_body(
            cmd,
            stdin=stdin,
            cwd=cwd,
            env=env,
            user=user,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )
        reader = StreamedExec(self.id)
        async for frame in self._c.events(_calls.exec_stream(self.id, body)):
            if (item := reader.accept(frame)) is not None:
                yield item
                if reader.result is not None:
                    return
        raise reader.ended_early()

    async def set_ttl(self, ttl_s: int) -> SandboxInfo:
        self.info = await self._c.call(_calls.set_ttl(self.id, ttl_s))
        return self.info

    async def commands(self, *, limit: int | None = None, cursor: str | None = None) -> CommandPage:
        return await self._c.call(_calls.list_commands(self.id, limit, cursor))

    async def refresh(self) -> SandboxInfo:
        self.info = await self._c.call(_calls.get_sandbox(self.id))
        return self.info

    async def delete(self) -> SandboxInfo:
        self.info = await self._c.call(_calls.delete_sandbox(self.id))
        return self.info


class AsyncSandboxFiles:
    """`sandbox.files`, awaited; see `sandhive_client.client.SandboxFiles`."""

    def __init__(self, client: AsyncSandhive, sandbox_id: str) -> None:
        self._c = client
        self._id = sandbox_id

    async def read(self, path: str) -> bytes:
        return await self._c.call(_calls.read_file(self._id, path))

    async def write(self, path: str, data: bytes | str) -> FileWritten:
        return await self._c.call(_calls.write_file(self._id, path, data))

    async def list(self, path: str | None = None) -> FileList:
        return await self._c.call(_calls.list_files(self._id, path))
