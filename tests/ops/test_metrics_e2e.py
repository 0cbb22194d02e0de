"""`/metrics` of the API and of the worker, parsed by Prometheus' own parser while a task runs.

Real `sandhive serve` and `sandhive worker` subprocesses (JSON logs on), the
scripted LLM, a real sandbox. Also checks the JSON log lines about the task.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, free_port, running_service

SECRET = "sk-operatorsecret0123456789"
API_SERIES = {
    "sandhive_tasks",
    "sandhive_queue_depth",
    "sandhive_queue_stream_length",
    "sandhive_queue_oldest_age_seconds",
    "sandhive_running_sandboxes",
    "sandhive_lost_attempts",
    "sandhive_workers",
    "sandhive_worker_slots_total",
    "sandhive_worker_busy",
    "sandhive_stream_clients",
    "sandhive_stream_feeds",
    "sandhive_stream_clients_dropped_total",
    "sandhive_live_events_dropped_total",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as (name, sorted labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def value(figures: dict, name: str, **labels: str) -> float:
    return float(figures.get((name, tuple(sorted(labels.items()))), 0.0))


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def service(settings: Settings, tmp_path: Path, metrics_port: int) -> Iterator[Service]:
    ops = settings.model_copy(
        update={
            "worker_metrics_port": metrics_port,
            "log_format": "json",
            "worker_heartbeat_s": 0.5,
            "llm_api_key": SECRET,
        }
    )
    with running_service(ops, tmp_path) as svc:
        yield svc


def wait_for(check, what: str, timeout_s: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def script() -> Script:
    return Script(
        turns=[
            Turn(tool="execute_bash", arguments={"command": "sleep 2; echo done"}),
            Turn(tool="submit", arguments={}, expect="done"),
        ]
    )


def test_metrics_change_as_a_task_runs_and_logs_are_json(
    service: Service, scripted_llm: ScriptedLLMServer, metrics_port: int
) -> None:
    scripted_llm.add_script("ops-metrics", script())
    api_metrics = f"{service.base_url}/metrics"
    worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"

    before = wait_for(
        lambda: (m := scrape(api_metrics)) and value(m, "sandhive_workers") == 1 and m,
        "the worker's heartbeat",
    )
    assert API_SERIES <= {name for name, _ in before}
    assert value(before, "sandhive_tasks", status="succeeded") == 0
    assert value(before, "sandhive_worker_slots_total", worker=worker_name(before)) == 2
    worker_before = wait_for(lambda: _try_scrape(worker_metrics), "the worker's /metrics")
    assert value(worker_before, "sandhive_worker_step_seconds_count") == 0
    start_count = "sandhive_worker_sandbox_start_seconds_count"
    assert ((start_count, (("source", "cold"),))) in worker_before, "present before any task"
    assert value(worker_before, start_count, source="cold") == 0
    assert ("sandhive_live_events_dropped_total", (("reason", "publish_failed"),)) in worker_before
    assert ("sandhive_live_events_dropped_total", (("reason", "slow_client"),)) in before

    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        response = client.post("/v1/tasks", json={"prompt": "go", "llm": {"model": "ops-metrics"}})
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        running = wait_for(
            lambda: (
                (m := scrape(api_metrics)) and value(m, "sandhive_running_sandboxes") == 1 and m
            ),
            "the task to run",
        )
        assert value(running, "sandhive_tasks", status="running") == 1
        live = scrape(worker_metrics)
        assert value(live, "sandhive_worker_running_sandboxes") == 1
        task = wait_for(
            lambda: (
                (t := client.get(f"/v1/tasks/{task_id}").json())["status"]
                not in ("queued", "running")
                and t
            ),
            "the task to finish",
        )
    assert task["status"] == "succeeded", service.logs()

    after = scrape(api_metrics)
    assert value(after, "sandhive_tasks", status="succeeded") == 1
    assert value(after, "sandhive_tasks", status="running") == 0
    assert value(after, "sandhive_running_sandboxes") == 0
    worker_after = scrape(worker_metrics)
    assert value(worker_after, "sandhive_worker_step_seconds_count") == 2
    assert value(worker_after, "sandhive_worker_command_seconds_count") >= 1
    assert value(worker_after, "sandhive_worker_command_seconds_sum") >= 2.0  # the sleep
    assert value(worker_after, "sandhive_worker_llm_seconds_count") == 2
    assert value(worker_after, "sandhive_worker_attempts_total", end="done") == 1
    assert value(worker_after, "sandhive_worker_running_sandboxes") == 0
    assert value(worker_after, "sandhive_worker_tokens_total", kind="prompt") > 0
    assert value(worker_after, start_count, source="cold") == 1  # no warm pool here
    assert value(worker_after, start_count, source="warm") == 0
    assert value(worker_after, "sandhive_worker_sandbox_start_seconds_sum", source="cold") > 0
    assert value(worker_after, "sandhive_live_events_dropped_total", reason="publish_failed") == 0

    check_json_logs(service, task_id)


def check_json_logs(service: Service, task_id: str) -> None:
    worker_log = (service.log_dir / "worker.log").read_text()
    lines = [json.loads(line) for line in worker_log.splitlines() if line.startswith("{")]
    assert lines, worker_log
    about = [line for line in lines if line.get("task_id") == task_id]
    assert about, worker_log
    started = [line for line in about if "started" in line["msg"]]
    assert started
    assert started[0]["attempt"] == 1
    assert started[0]["tenant"] == "default"
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert SECRET not in service.logs()


def worker_name(figures: dict) -> str:
    names = [dict(labels)["worker"] for name, labels in figures if name == "sandhive_worker_busy"]
    assert len(names) == 1, figures
    return names[0]


def _try_scrape(url: str) -> dict | None:
    try:
        return scrape(url)
    except httpx.HTTPError:
        return None
