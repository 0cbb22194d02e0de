"""The asyncio client: `AsyncSandhive(base_url, api_key)`, the same calls as `Sandhive`, awaited."""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from sandhive_client import _calls, errors
from sandhive_client._http import (
    RETRY_STATUSES,
    Call,
    Retries,
    headers_of,
    may_resend,
    raise_for_error,
    retry_after,
)
from sandhive_client._resume import Resume
from sandhive_client._sse import aframes
from sandhive_client._version import __version__
from sandhive_client.client import DEFAULT_TIMEOUT, STREAM_TIMEOUT, base_url_of
from sandhive_client.models import (
    ArtifactList,
    BatchResult,
    Event,
    Experiment,
    ExperimentItem,
    ExperimentPage,
    Task,
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
                    headers={**self._headers, **call.headers},
                )
            except httpx.TransportError as exc:
                if last or not may_resend(call, exc):
                    raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
                await asyncio.sleep(self.retries.delay(attempt + 1, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                await asyncio.sleep(self.retries.delay(attempt + 1, retry_after(response)))
                continue
            raise_for_error(response)
            return call.read(response)
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
