"""Every endpoint the client calls, written once as a `Call` for both transports."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from sandhive_client._http import Call
from sandhive_client.models import (
    ArtifactList,
    BatchResult,
    Experiment,
    ExperimentItem,
    ExperimentPage,
    Task,
    TaskPage,
    Trajectory,
)


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
