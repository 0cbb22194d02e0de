"""One task through real processes: HTTP → Postgres → Redis → worker → Docker → LLM → back.

The API and a worker run as `python -m app serve|worker` subprocesses against
the session's Postgres database, Redis DB 15, the Docker daemon and the
scripted LLM; nothing in between is replaced.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from app.llm.transport import retry_delay
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, free_port, running_service

SQUARES = "print(sum(i * i for i in range(1, 101)))"
EXPECTED = str(sum(i * i for i in range(1, 101)))  # computed here, independent of the sandbox


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


def wait_finished(client: httpx.Client, task_id: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = client.get(f"/v1/tasks/{task_id}").json()
        if task["status"] not in ("queued", "running"):
            return task
        time.sleep(0.3)
    raise AssertionError(f"task {task_id} did not finish in {timeout_s} s: {task}")


def containers_of(task_id: str, settle_s: float = 10.0) -> list[str]:
    """The task's containers still there once its removal (in the background, after the
    task's end: `Runner(remove_in_background=True)`) has had `settle_s` to finish."""
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=sandhive.task={task_id}"],
            capture_output=True,
            text=True,
            check=True,
        )
        left = out.stdout.split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def submit(client: httpx.Client, model: str, **extra: object) -> str:
    response = client.post(
        "/v1/tasks", json={"prompt": "compute", "llm": {"model": model}, **extra}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def answer_script() -> Script:
    return Script(
        turns=[
            Turn(
                tool="execute_bash",
                arguments={"command": f'python3 -c "{SQUARES}"'},
                content="Let me compute it.",
            ),
            Turn(
                tool="str_replace_editor",
                arguments={
                    "command": "create",
                    "path": "/testbed/output/answer.txt",
                    "file_text": EXPECTED,
                },
                expect=EXPECTED,
            ),
            Turn(tool="submit", arguments={}, expect="File created"),
        ]
    )


def stream_events(url: str) -> tuple[list[dict], int | None]:
    """Every message of a WebSocket stream until the server closes it, and the close code."""
    return asyncio.run(read_stream(url))


async def read_stream(url: str) -> tuple[list[dict], int | None]:
    events: list[dict] = []
    async with websockets.connect(url, open_timeout=10) as ws:
        try:
            async for message in ws:
                events.append(json.loads(message))
        except websockets.ConnectionClosed:
            pass  # a non-1000 close ends the loop with an error; the code is what we check
        return events, ws.close_code


def test_task_runs_end_to_end(service: Service, scripted_llm: ScriptedLLMServer) -> None:
    scripted_llm.add_script("e2e-answer", answer_script())
    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        task_id = submit(client, "e2e-answer")
        task = wait_finished(client, task_id)
        assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), service.logs()
        assert task["answer"] == EXPECTED
        assert task["attempt"] == 1
        assert task["usage"]["steps"] == 3
        # The session's one scripted server serves other tests too: only this model's count.
        assert [f for f in scripted_llm.failures if f.startswith("e2e-answer")] == []

        steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
        assert [s["action"]["tool"] for s in steps] == [
            "execute_bash",
            "str_replace_editor",
            "submit",
        ]
        assert EXPECTED in steps[0]["observation"]
        assert steps[0]["exit_code"] == 0
        assert steps[0]["thought"] == "Let me compute it."
        assert "File created at /testbed/output/answer.txt" in steps[1]["observation"]
        assert steps[2]["observation"] == "<<< Finished >>>"

        listed = client.get(f"/v1/tasks/{task_id}/artifacts").json()["items"]
        assert [(a["path"], a["size"]) for a in listed] == [("answer.txt", len(EXPECTED))]
        download = client.get(f"/v1/tasks/{task_id}/artifacts/answer.txt")
        assert download.status_code == 200
        assert download.content == EXPECTED.encode()

    assert containers_of(task_id) == []

    ws_base = service.base_url.replace("http://", "ws://")
    events, code = stream_events(f"{ws_base}/v1/tasks/{task_id}/stream?after=0")
    assert code == 1000
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    assert types[:2] == ["task.queued", "task.started"]
    assert types[-1] == "task.finished"
    assert types.count("step.completed") == 3
    assert "artifact.created" in types
    resumed, _ = stream_events(f"{ws_base}/v1/tasks/{task_id}/stream?after=3")
    assert [e["seq"] for e in resumed] == list(range(4, len(events) + 1))


def test_stream_of_unknown_task_closes_4404(service: Service) -> None:
    ws_base = service.base_url.replace("http://", "ws://")
    events, code = stream_events(f"{ws_base}/v1/tasks/tsk_nope/stream")
    assert (events, code) == ([], 4404)


def test_never_submitting_task_ends_at_max_steps(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(
        "e2e-loop",
        Script(
            turns=[Turn(tool="execute_bash", arguments={"command": "echo again"})], repeat_last=True
        ),
    )
    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        task_id = submit(client, "e2e-loop", limits={"max_steps": 3})
        task = wait_finished(client, task_id)
        assert (task["status"], task["finish_reason"]) == ("failed", "max_steps")
        assert len(client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]) == 3
        assert task["answer"] is None
    assert containers_of(task_id) == []


def test_llm_500_fails_task_with_llm_error(
    service: Service, scripted_llm: ScriptedLLMServer, settings: Settings
) -> None:
    scripted_llm.add_script("e2e-500", Script(turns=[], fail_status=500))
    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        task_id = submit(client, "e2e-500")
        task = wait_finished(client, task_id)
    assert (task["status"], task["finish_reason"]) == ("failed", "llm_error")
    assert "500" in task["error"]
    assert scripted_llm.requests["e2e-500"] == settings.llm_max_retries + 1
    assert containers_of(task_id) == []


@pytest.fixture
def dead_profile_settings(settings: Settings, tmp_path: Path) -> Settings:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        f'[profiles.dead]\nbase_url = "http://127.0.0.1:{free_port()}/v1"\nmodel = "nobody"\n'
    )
    return settings.model_copy(update={"llm_profiles_file": profiles})


def test_unreachable_llm_fails_task_with_llm_error(
    dead_profile_settings: Settings, tmp_path: Path
) -> None:
    with (
        running_service(dead_profile_settings, tmp_path) as svc,
        httpx.Client(base_url=svc.base_url, timeout=10) as client,
    ):
        response = client.post("/v1/tasks", json={"prompt": "x", "llm": {"profile": "dead"}})
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        task = wait_finished(client, task_id)
    assert (task["status"], task["finish_reason"]) == ("failed", "llm_error")
    assert "unreachable" in task["error"].lower()
    # Bounded retries: nothing answers on the port, so the attempts are counted by the client
    # itself (app/llm/transport.py puts the count in the error)...
    retries = dead_profile_settings.llm_max_retries
    assert f"(after {retries + 1} attempt(s))" in task["error"], task["error"]
    # ...and the attempt's time is its backoffs plus a refused connect each, far under a minute.
    backoffs = sum(
        retry_delay(n, dead_profile_settings.llm_retry_backoff_s, None)
        for n in range(1, retries + 1)
    )
    ran_s = (
        datetime.fromisoformat(task["finished_at"]) - datetime.fromisoformat(task["started_at"])
    ).total_seconds()
    assert ran_s < backoffs + 30, (ran_s, backoffs)
    assert containers_of(task_id) == []
