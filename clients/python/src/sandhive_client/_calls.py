"""Every endpoint the client calls, written once as a `Call` for both transports."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from sandhive_client import errors
from sandhive_client._http import Call
from sandhive_client.models import (
    ArtifactList,
    BatchResult,
    CommandPage,
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

CREATE_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
"""`POST /v1/sandboxes` answers once the sandbox runs (the server gives up first)."""
FILE_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
"""A file of up to the server's limit (128 MiB by default) goes through its worker."""
BUILD_TIMEOUT_S = 960.0
"""How long `images.build` waits for its answer: the server's default build timeout
(`SANDHIVE_IMAGE_BUILD_TIMEOUT_S`, 900 s), and the upload."""
EXEC_SLACK_S = 60.0
"""How much longer than a command's own timeout its request may take (start, output)."""


def _json(response: httpx.Response) -> Any:
    return response.json()


def _bytes(response: httpx.Response) -> bytes:
    return response.content


def _seg(value: str) -> str:
    return quote(value, safe="")


def _query(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def create_task(prompt: str, idempotency_key: str | None, fields: Mapping[str, Any]) -> Call[Task]:
    key = idempotency_key or str(uuid.uuid4())
    return Call(
        "POST",
        "/v1/tasks",
        lambda r: Task.model_validate(r.json()),
        json={"prompt": prompt, **fields},
        headers={"Idempotency-Key": key},
    )


def create_batch(tasks: Sequence[Mapping[str, Any]]) -> Call[BatchResult]:
    # A key per task unless given, so that sending the batch again after a lost
    # answer returns the same tasks instead of queueing them twice.
    items = [
        {**task, "idempotency_key": task.get("idempotency_key") or str(uuid.uuid4())}
        for task in tasks
    ]
    return Call(
        "POST",
        "/v1/tasks/batch",
        lambda r: BatchResult.model_validate(r.json()),
        json={"tasks": items},
    )


def get_task(task_id: str) -> Call[Task]:
    return Call("GET", f"/v1/tasks/{_seg(task_id)}", lambda r: Task.model_validate(r.json()))


def list_tasks(
    status: str | None, limit: int | None, cursor: str | None, filters: Mapping[str, Any]
) -> Call[TaskPage]:
    params = {**_query(status=status, limit=limit, cursor=cursor), **filters}
    return Call("GET", "/v1/tasks", lambda r: TaskPage.model_validate(r.json()), params=params)


def cancel_task(task_id: str) -> Call[Task]:
    return Call(
        "POST", f"/v1/tasks/{_seg(task_id)}/cancel", lambda r: Task.model_validate(r.json())
    )


def fork_task(task_id: str, step: int, n: int, fields: Mapping[str, Any]) -> Call[TaskFork]:
    return Call(
        "POST",
        f"/v1/tasks/{_seg(task_id)}/fork",
        lambda r: TaskFork.model_validate(r.json()),
        json={**fields, "step": step, "n": n},
    )


def trajectory(task_id: str, attempt: int | None) -> Call[Trajectory]:
    return Call(
        "GET",
        f"/v1/tasks/{_seg(task_id)}/trajectory",
        lambda r: Trajectory.model_validate(r.json()),
        params=_query(attempt=attempt),
    )


def list_artifacts(task_id: str) -> Call[ArtifactList]:
    return Call(
        "GET",
        f"/v1/tasks/{_seg(task_id)}/artifacts",
        lambda r: ArtifactList.model_validate(r.json()),
    )


def download_artifact(task_id: str, path: str) -> Call[bytes]:
    return Call("GET", f"/v1/tasks/{_seg(task_id)}/artifacts/{quote(path, safe='/')}", _bytes)


def artifacts_zip(task_id: str) -> Call[bytes]:
    return Call("GET", f"/v1/tasks/{_seg(task_id)}/artifacts.zip", _bytes)


def create_experiment(spec: Mapping[str, Any]) -> Call[Experiment]:
    return Call(
        "POST", "/v1/experiments", lambda r: Experiment.model_validate(r.json()), json=dict(spec)
    )


def get_experiment(experiment_id: str) -> Call[Experiment]:
    return Call(
        "GET",
        f"/v1/experiments/{_seg(experiment_id)}",
        lambda r: Experiment.model_validate(r.json()),
    )


def list_experiments(
    status: str | None, limit: int | None, cursor: str | None
) -> Call[ExperimentPage]:
    return Call(
        "GET",
        "/v1/experiments",
        lambda r: ExperimentPage.model_validate(r.json()),
        params=_query(status=status, limit=limit, cursor=cursor),
    )


def experiment_results(
    experiment_id: str, format: str | None, grading: int | None
) -> Call[dict[str, Any]]:
    return Call(
        "GET",
        f"/v1/experiments/{_seg(experiment_id)}/results",
        _json,
        params=_query(format=format, grading=grading),
    )


def experiment_items(experiment_id: str) -> Call[list[ExperimentItem]]:
    return Call(
        "GET",
        f"/v1/experiments/{_seg(experiment_id)}/items",
        lambda r: [ExperimentItem.model_validate(item) for item in r.json()["items"]],
    )


def cancel_experiment(experiment_id: str) -> Call[Experiment]:
    return Call(
        "POST",
        f"/v1/experiments/{_seg(experiment_id)}/cancel",
        lambda r: Experiment.model_validate(r.json()),
    )


def events_path(task_id: str) -> str:
    return f"/v1/tasks/{_seg(task_id)}/events"


# Sandboxes


def _sandbox(response: httpx.Response) -> SandboxInfo:
    return SandboxInfo.model_validate(response.json())


def sandbox_path(sandbox_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{_seg(sandbox_id)}{tail}"


def create_sandbox(fields: Mapping[str, Any]) -> Call[SandboxInfo]:
    body = {k: v for k, v in fields.items() if v is not None}
    return Call("POST", "/v1/sandboxes", _sandbox, json=body, timeout=CREATE_TIMEOUT)


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("GET", sandbox_path(sandbox_id), _sandbox)


def list_sandboxes(
    status: str | None,
    limit: int | None,
    cursor: str | None,
    metadata: Mapping[str, str] | None,
    filters: Mapping[str, Any],
) -> Call[SandboxPage]:
    labels = {f"metadata.{key}": value for key, value in (metadata or {}).items()}
    params = {**_query(status=status, limit=limit, cursor=cursor), **labels, **filters}
    return Call(
        "GET", "/v1/sandboxes", lambda r: SandboxPage.model_validate(r.json()), params=params
    )


def delete_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("DELETE", sandbox_path(sandbox_id), _sandbox)


def set_ttl(sandbox_id: str, ttl_s: int) -> Call[SandboxInfo]:
    return Call("POST", sandbox_path(sandbox_id, "/ttl"), _sandbox, json={"ttl_s": ttl_s})


def exec_body(
    cmd: str | Sequence[str],
    *,
    stdin: str | bytes | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | None,
    timeout_s: float | None,
    max_output_bytes: int | None,
) -> dict[str, Any]:
    """The body of `POST …/exec`: a string is a shell command line, a sequence an argv.
    Output is always asked as base64, so the bytes round-trip exactly."""
    body: dict[str, Any] = {"command": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if isinstance(stdin, bytes):
        try:  # as text when it is text: a third smaller than base64, the same bytes
            body["stdin"] = stdin.decode("utf-8")
        except UnicodeDecodeError:
            body["stdin"] = base64.b64encode(stdin).decode("ascii")
            body["stdin_encoding"] = "base64"
    elif stdin is not None:
        body["stdin"] = stdin
    body["output_encoding"] = "base64"
    body |= _query(
        cwd=cwd,
        env=dict(env) if env else None,
        user=user,
        timeout_s=timeout_s,
        max_output_bytes=max_output_bytes,
    )
    return body


def exec_timeout(timeout_s: float | None) -> httpx.Timeout:
    """A command's request waits for the command: no read timeout unless it has its own
    (the server ends it at its default timeout or at the sandbox's expiry)."""
    read = None if timeout_s is None else timeout_s + EXEC_SLACK_S
    return httpx.Timeout(30.0, read=read)


def exec_command(sandbox_id: str, body: Mapping[str, Any]) -> Call[ExecResult]:
    return Call(
        "POST",
        sandbox_path(sandbox_id, "/exec"),
        lambda r: ExecResult.from_wire(r.json()),
        json=dict(body),
        timeout=exec_timeout(body.get("timeout_s")),
        once=True,
    )


def read_file(sandbox_id: str, path: str) -> Call[bytes]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/files"),
        _bytes,
        params={"path": path},
        headers={"Accept": "application/octet-stream, application/json"},
        timeout=FILE_TIMEOUT,
        errors_by_reason=errors.FILE_ERRORS,
    )


def write_file(sandbox_id: str, path: str, data: bytes | str) -> Call[FileWritten]:
    content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return Call(
        "PUT",
        sandbox_path(sandbox_id, "/files"),
        lambda r: FileWritten.model_validate(r.json()),
        params={"path": path},
        content=content,
        headers={"Content-Type": "application/octet-stream"},
        timeout=FILE_TIMEOUT,
        errors_by_reason=errors.FILE_ERRORS,
    )


def list_files(sandbox_id: str, path: str | None) -> Call[FileList]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/files/list"),
        lambda r: FileList.model_validate(r.json()),
        params=_query(path=path),
        errors_by_reason=errors.FILE_ERRORS,
    )


def list_commands(sandbox_id: str, limit: int | None, cursor: str | None) -> Call[CommandPage]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/commands"),
        lambda r: CommandPage.model_validate(r.json()),
        params=_query(limit=limit, cursor=cursor),
    )


def exec_stream(sandbox_id: str, body: Mapping[str, Any]) -> Call[None]:
    """`POST …/exec/stream`: read as events (`Sandhive.events`), not by `read`."""
    return Call(
        "POST",
        sandbox_path(sandbox_id, "/exec/stream"),
        lambda r: None,
        json=dict(body),
        timeout=exec_timeout(body.get("timeout_s")),
        once=True,
    )


# Images


def _build(response: httpx.Response) -> ImageBuild:
    return ImageBuild.model_validate(response.json())


def build_path(name: str) -> str:
    return f"/v1/images/builds/{_seg(name)}"


def list_images() -> Call[list[Image]]:
    return Call(
        "GET",
        "/v1/images",
        lambda r: [Image.model_validate(image) for image in r.json()["images"]],
    )


def build_image(body: Mapping[str, Any], timeout_s: float | None) -> Call[ImageBuild]:
    # Not `once`: a build is idempotent by digest, so a 503 sent again builds nothing twice.
    return Call(
        "POST",
        "/v1/images/builds",
        _build,
        json=dict(body),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    )


def get_build(name: str) -> Call[ImageBuild]:
    return Call("GET", build_path(name), _build)


def list_builds() -> Call[list[ImageBuild]]:
    return Call(
        "GET",
        "/v1/images/builds",
        lambda r: [ImageBuild.model_validate(item) for item in r.json()["items"]],
    )


def delete_build(name: str) -> Call[None]:
    return Call("DELETE", build_path(name), lambda r: None)
