"""The synchronous client: `Sandhive(base_url, api_key)`, then `.tasks` and `.experiments`."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Iterator, Mapping, Sequence
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
from sandhive_client._sse import frames
from sandhive_client._version import __version__
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
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
STREAM_TIMEOUT = httpx.Timeout(10.0, read=None)  # keepalives come; a quiet task is fine


def base_url_of(base_url: str | None) -> str:
    url = base_url or os.environ.get("SANDHIVE_URL")
    if not url:
        raise ValueError("pass base_url (or set SANDHIVE_URL), e.g. http://127.0.0.1:8000")
    return url.rstrip("/")


class Sandhive:
    """A Sandhive API. Use as a context manager, or call `close()` when done."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retries: Retries | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("SANDHIVE_API_KEY")
        self._http = http_client or httpx.Client(timeout=timeout)
        self._base = base_url_of(base_url)
        self._headers = headers_of(key, f"sandhive-client/{__version__}")
        self.retries = retries or Retries()
        self.tasks = Tasks(self)
        self.experiments = Experiments(self)

    def __enter__(self) -> Sandhive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, call: Call[T]) -> T:
        """Send `call`, retrying 429/503 (after Retry-After) and refused connections, bounded."""
        for attempt in range(self.retries.max_retries + 1):
            last = attempt == self.retries.max_retries
            try:
                response = self._http.request(
                    call.method,
                    self._base + call.path,
                    params=call.params,
                    json=call.json,
                    headers={**self._headers, **call.headers},
                )
            except httpx.TransportError as exc:
                if last or not may_resend(call, exc):
                    raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
                time.sleep(self.retries.delay(attempt + 1, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self.retries.delay(attempt + 1, retry_after(response)))
                continue
            raise_for_error(response)
            return call.read(response)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def stream(
        self, task_id: str, *, after: int = 0, reconnect_for_s: float = 60.0
    ) -> Iterator[Event]:
        """The task's events from `after` on, until `task.finished`.

        A dropped connection (or an API restart) is resumed with Last-Event-ID = the last
        seq seen, so no durable event is lost or repeated; it gives up (ConnectionFailed)
        after `reconnect_for_s` without getting a new event.
        """
        resume = Resume(task_id, after, reconnect_for_s)
        url = self._base + _calls.events_path(task_id)
        while True:
            cause: Exception | None = None  # None: the server ended the response early
            try:
                with self._http.stream(
                    "GET", url, headers=resume.headers(self._headers), timeout=STREAM_TIMEOUT
                ) as response:
                    if response.status_code == 204:
                        return  # finished, and nothing after the last seq seen
                    if not response.is_success:
                        response.read()
                        raise_for_error(response)
                    for frame in frames(response.iter_lines()):
                        if (event := resume.accept(frame)) is not None:
                            yield event
                            if event.type == "task.finished":
                                return
            except (httpx.TransportError, errors.RetryableError) as exc:
                cause = exc
            time.sleep(resume.pause(cause, self.retries.max_wait_s))


class Tasks:
    """`client.tasks`: submit, read, wait for, cancel tasks; their trajectory and artifacts."""

    def __init__(self, client: Sandhive) -> None:
        self._c = client
        self.artifacts = Artifacts(client)

    def create(self, prompt: str, *, idempotency_key: str | None = None, **fields: Any) -> Task:
        """Queue a task; `fields` are the rest of `POST /v1/tasks` (llm, limits, sandbox,
        tools, prompt_config, input_files, metadata, mode). The Idempotency-Key (a new
        UUID unless given) makes the retries of this call safe."""
        return self._c.call(_calls.create_task(prompt, idempotency_key, fields))

    def create_batch(self, tasks: Sequence[Mapping[str, Any]]) -> BatchResult:
        """Queue all `tasks` (each a `POST /v1/tasks` body, optionally with its
        `idempotency_key`) or none: InvalidInput names `tasks.N.field`, RateLimited means
        the batch does not fit the tenant's limits."""
        return self._c.call(_calls.create_batch(tasks))

    def get(self, task_id: str) -> Task:
        return self._c.call(_calls.get_task(task_id))

    def list(
        self,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        **filters: Any,
    ) -> TaskPage:
        """One page, newest first; `filters` as the API's query (q, model, created_after...)."""
        return self._c.call(_calls.list_tasks(status, limit, cursor, filters))

    def cancel(self, task_id: str) -> Task:
        return self._c.call(_calls.cancel_task(task_id))

    def wait(self, task_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0) -> Task:
        """The task once it has ended; WaitTimeout after `timeout_s` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            task = self.get(task_id)
            if task.done:
                return task
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise errors.WaitTimeout(f"{task_id} is still {task.status} after {timeout_s} s")
            time.sleep(poll_s)

    def trajectory(self, task_id: str, *, attempt: int | None = None) -> Trajectory:
        return self._c.call(_calls.trajectory(task_id, attempt))

    def stream(
        self, task_id: str, *, after: int = 0, reconnect_for_s: float = 60.0
    ) -> Iterator[Event]:
        """Same as `Sandhive.stream`."""
        return self._c.stream(task_id, after=after, reconnect_for_s=reconnect_for_s)


class Artifacts:
    """`client.tasks.artifacts`: the files a task left in its output directory."""

    def __init__(self, client: Sandhive) -> None:
        self._c = client

    def list(self, task_id: str) -> ArtifactList:
        return self._c.call(_calls.list_artifacts(task_id))

    def download(self, task_id: str, path: str) -> bytes:
        """One artifact's bytes (`path` relative to the output directory)."""
        return self._c.call(_calls.download_artifact(task_id, path))

    def zip(self, task_id: str) -> bytes:
        """Every artifact in one zip archive."""
        return self._c.call(_calls.artifacts_zip(task_id))


class Experiments:
    """`client.experiments`: a dataset run over arms, scored."""

    def __init__(self, client: Sandhive) -> None:
        self._c = client

    def create(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Experiment:
        """Start one: `POST /v1/experiments`'s body (name, dataset, arms, scorer, ...)."""
        return self._c.call(_calls.create_experiment({**(spec or {}), **fields}))

    def get(self, experiment_id: str) -> Experiment:
        return self._c.call(_calls.get_experiment(experiment_id))

    def list(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> ExperimentPage:
        return self._c.call(_calls.list_experiments(status, limit, cursor))

    def results(
        self, experiment_id: str, *, format: str | None = None, grading: int | None = None
    ) -> dict[str, Any]:
        """Per-arm statistics and paired comparisons (`format="package"`: results.json's)."""
        return self._c.call(_calls.experiment_results(experiment_id, format, grading))

    def items(self, experiment_id: str) -> builtins.list[ExperimentItem]:
        return self._c.call(_calls.experiment_items(experiment_id))

    def cancel(self, experiment_id: str) -> Experiment:
        return self._c.call(_calls.cancel_experiment(experiment_id))
