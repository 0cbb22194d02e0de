"""The synchronous client: `Sandhive(base_url, api_key)`, then `.tasks`, `.experiments`,
`.sandboxes` and `.images`."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Iterator, Mapping, Sequence
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
from sandhive_client._sse import Frame, frames
from sandhive_client._version import __version__
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
        self.sandboxes = Sandboxes(self)
        self.images = Images(self)

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
                    content=call.content,
                    headers={**self._headers, **call.headers},
                    timeout=call.timeout_or(httpx.USE_CLIENT_DEFAULT),
                )
            except httpx.TransportError as exc:
                if last or not may_resend(call, exc):
                    raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
                time.sleep(self.retries.delay(attempt + 1, None))
                continue
            if retried(call, response.status_code) and not last:
                time.sleep(self.retries.delay(attempt + 1, retry_after(response)))
                continue
            raise_for_error(response, call.errors_by_reason)
            return call.read(response)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def events(self, call: Call[Any]) -> Iterator[Frame]:
        """The Server-Sent Events `call` answers, read as they come; 429/503 before the
        stream starts are retried as `call` does, a broken stream is ConnectionFailed."""
        for attempt in range(self.retries.max_retries + 1):
            last = attempt == self.retries.max_retries
            wait: float | None = None
            try:
                with self._http.stream(
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
                        response.read()
                        raise_for_error(response, call.errors_by_reason)
                    else:
                        yield from frames(response.iter_lines())
                        return
            except httpx.TransportError as exc:
                raise errors.ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
            time.sleep(wait or 0.0)
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

    def fork(self, task_id: str, step: int, *, n: int = 1, **fields: Any) -> TaskFork:
        """`n` new tasks that replay the task's steps before `step` in a fresh sandbox, then go
        on with a model (`llm=...` for another one; `allow_divergence`, `limits`:
        docs/fork.md)."""
        return self._c.call(_calls.fork_task(task_id, step, n, fields))

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


class Sandboxes:
    """`client.sandboxes`: sandboxes you drive yourself (run commands, move files)."""

    def __init__(self, client: Sandhive) -> None:
        self._c = client

    def create(
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
    ) -> Sandbox:
        """Start a sandbox of the catalogue's `image` and return it once it runs.

        It lives `ttl_s` seconds (the server's default, 600, when None) unless extended
        with `set_ttl` or deleted; `env` is what every command sees; `metadata` labels
        it. None leaves a limit to the image's default. The image's own files are
        read-only unless `read_only_rootfs=False` (where the operator allows it); the
        workdir and /tmp-like scratch directories are always writable. Use it as a context
        manager to delete it at the end of the block."""
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
        return Sandbox(self._c, self._c.call(_calls.create_sandbox(body)))

    def get(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (NotFound if it is not this tenant's)."""
        return Sandbox(self._c, self._c.call(_calls.get_sandbox(sandbox_id)))

    def list(
        self,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **filters: Any,
    ) -> SandboxPage:
        """One page, newest first (`status`: `starting`, `running` or `ended`), only those
        labelled with every `metadata` pair; `sandboxes.get(info.id)` gives a handle on one."""
        return self._c.call(_calls.list_sandboxes(status, limit, cursor, metadata, filters))


class Images:
    """`client.images`: the images sandboxes may name, and the tenant's own, built from a
    Dockerfile where the operator allows it (`SANDHIVE_IMAGE_BUILDS`)."""

    def __init__(self, client: Sandhive) -> None:
        self._c = client

    def list(self) -> builtins.list[Image]:
        """The catalogue images this tenant may use, and its ready builds (`built/NAME`)."""
        return self._c.call(_calls.list_images())

    def build(
        self,
        name: str,
        dockerfile: Dockerfile,
        *,
        context: Context = None,
        build_args: Mapping[str, str] | None = None,
        description: str = "",
        timeout_s: float | None = _calls.BUILD_TIMEOUT_S,
    ) -> ImageBuild:
        """Build `dockerfile` (its text, or a Path to read) as the tenant's image `name`, and
        return it once built: sandboxes then name `built/NAME` (`ImageBuild.image`).

        `context` is a directory (sent as a tar.gz of its tree, symlinks kept as links;
        `.dockerignore` is not read), a tar archive's bytes or path, or None (`COPY` then
        has nothing to copy). The same Dockerfile, context and arguments again answer the
        image already built. ImageBuildFailed (an InvalidInput) when Docker's build failed,
        with its `log`; InvalidInput for a Dockerfile the server refuses (a `FROM` outside
        the catalogue, `ADD` of a URL); Forbidden (code `image_builds_disabled`) where
        builds are off. `timeout_s`: seconds to wait for the answer (None: no limit). A 429
        or 503 is sent again as other calls are (a build is idempotent); a connection lost
        while it builds is ConnectionFailed: call again."""
        body = build_body(name, dockerfile, context, build_args, description)
        return self._c.call(_calls.build_image(body, timeout_s))

    def get_build(self, name: str) -> ImageBuild:
        """One of the tenant's builds (NotFound if none has that name), failed ones too."""
        return self._c.call(_calls.get_build(name))

    def list_builds(self) -> builtins.list[ImageBuild]:
        """The tenant's builds, newest first."""
        return self._c.call(_calls.list_builds())

    def delete_build(self, name: str) -> None:
        """Remove the image (sandboxes running it keep it until they end)."""
        self._c.call(_calls.delete_build(name))


class Sandbox:
    """One sandbox: `exec`, `exec_stream`, `files`, `set_ttl`, `commands`, `delete`.

    `info` is what the server last said about it (`refresh()` asks again). As a context
    manager it is deleted when the block ends."""

    def __init__(self, client: Sandhive, info: SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.files = SandboxFiles(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.status}>"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def exec(
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
        """Run `cmd` and wait for it: a list is an argv run as it is, a string a shell
        command line (`/bin/sh -c`).

        `cwd` relative is below the sandbox's workdir; `user` a user of the image (root
        when None); `timeout_s` kills it and everything it started (`timed_out`, exit_code
        None; the server's default when None). A command that cannot start answers
        exit_code 126 with the reason in stderr. Conflict once the sandbox has ended."""
        body = _calls.exec_body(
            cmd,
            stdin=stdin,
            cwd=cwd,
            env=env,
            user=user,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )
        return self._c.call(_calls.exec_command(self.id, body))

    def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[ExecOutput | ExecResult]:
        """As `exec`, but yields the output while the command runs: `ExecOutput` pieces
        (`stream`, `data` bytes), then the `ExecResult` (with the whole output) last.
        CommandStreamError when the server ends the stream with an error (e.g. its worker
        was lost after the command was sent)."""
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
        for frame in self._c.events(_calls.exec_stream(self.id, body)):
            if (item := reader.accept(frame)) is not None:
                yield item
                if reader.result is not None:
                    return
        raise reader.ended_early()

    def set_ttl(self, ttl_s: int) -> SandboxInfo:
        """Keep it `ttl_s` seconds from now (`info.expires_at` moves), within the server's
        lifetime cap."""
        self.info = self._c.call(_calls.set_ttl(self.id, ttl_s))
        return self.info

    def commands(self, *, limit: int | None = None, cursor: str | None = None) -> CommandPage:
        """The commands run in it, oldest first: argv or command, user, exit code, key."""
        return self._c.call(_calls.list_commands(self.id, limit, cursor))

    def refresh(self) -> SandboxInfo:
        self.info = self._c.call(_calls.get_sandbox(self.id))
        return self.info

    def delete(self) -> SandboxInfo:
        """End it and remove its container (again: the same answer)."""
        self.info = self._c.call(_calls.delete_sandbox(self.id))
        return self.info


class SandboxFiles:
    """`sandbox.files`: read, write and list a sandbox's files (relative paths are below
    its workdir).

    Errors are the client's and Python's own: SandboxFileNotFound (a FileNotFoundError),
    SandboxIsADirectory (an IsADirectoryError), SandboxPermissionError (a PermissionError),
    SandboxFileTooLarge (over the server's limit); each names the path."""

    def __init__(self, client: Sandhive, sandbox_id: str) -> None:
        self._c = client
        self._id = sandbox_id

    def read(self, path: str) -> bytes:
        return self._c.call(_calls.read_file(self._id, path))

    def write(self, path: str, data: bytes | str) -> FileWritten:
        """Write `data` (a str as UTF-8) as the file, replacing it; missing parent
        directories are made."""
        return self._c.call(_calls.write_file(self._id, path, data))

    def list(self, path: str | None = None) -> FileList:
        """A directory's entries (the workdir when `path` is None)."""
        return self._c.call(_calls.list_files(self._id, path))
