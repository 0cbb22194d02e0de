"""Live-only events of a real task: model text while it streams, command output while it runs.

API and worker run as subprocesses, the command runs in a real sandbox, the
scripted LLM streams its answer; a WebSocket client watches from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, running_service

COUNTING = "for i in 1 2 3; do echo $i; sleep 0.5; done; echo done >&2"
THOUGHT = "Counting slowly, one number every half second — ✓."
REASONING = "The user wants to see output arrive while the command runs."


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


async def watch(url: str) -> tuple[list[tuple[float, dict[str, Any]]], int | None]:
    """(arrival time, message) for every message until the server closes; the close code."""
    seen: list[tuple[float, dict[str, Any]]] = []
    async with websockets.connect(url) as ws:
        with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
            async with asyncio.timeout(120):
                async for message in ws:
                    seen.append((time.monotonic(), json.loads(message)))
    return seen, ws.close_code


def test_deltas_and_command_output_arrive_before_their_step_completes(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(
        "live-counting",
        Script(
            turns=[
                Turn(
                    tool="execute_bash",
                    arguments={"command": COUNTING},
                    content=THOUGHT,
                    reasoning=REASONING,
                    stream_delay_s=0.15,
                ),
                Turn(tool="submit", expect="3"),
            ]
        ),
    )
    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        created = client.post(
            "/v1/tasks", json={"prompt": "count", "llm": {"model": "live-counting"}}
        )
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]
    ws_url = service.base_url.replace("http://", "ws://")
    seen, code = asyncio.run(watch(f"{ws_url}/v1/tasks/{task_id}/stream?after=0"))

    if code != 1000:
        task = httpx.get(f"{service.base_url}/v1/tasks/{task_id}").json()
        raise AssertionError(f"stream ended {code}; task {task}; seen {seen}\n{service.logs()}")
    messages = [m for _, m in seen]
    durable = [m["seq"] for m in messages if m["seq"] is not None]
    assert durable == list(range(1, len(durable) + 1))
    assert messages[-1]["type"] == "task.finished"
    assert messages[-1]["data"]["status"] == "succeeded", service.logs()

    completed_at, completed = next(
        (t, m) for t, m in seen if m["type"] == "step.completed" and m["data"]["index"] == 0
    )
    position = messages.index(completed)
    outputs = [(t, m["data"]) for t, m in seen if m["type"] == "tool.output"]
    stdout = [data["chunk"] for _, data in outputs if data["stream"] == "stdout"]
    # Streamed while it ran: one event per echo (half a second apart), not one at the end.
    assert len(stdout) >= 3
    assert "".join(stdout) == "1\n2\n3\n"
    assert "".join(d["chunk"] for _, d in outputs if d["stream"] == "stderr") == "done\n"
    assert all(data["index"] == 0 for _, data in outputs)
    assert all(messages.index(m) < position for _, m in seen if m["type"] == "tool.output")
    assert completed_at - outputs[0][0] >= 0.5  # the first line came while `sleep` still ran

    deltas = [m["data"] for m in messages[:position] if m["type"] == "llm.delta"]
    assert all(data["index"] == 0 for data in deltas)
    text = [data["text"] for data in deltas if "text" in data]
    thought = [data["reasoning"] for data in deltas if "reasoning" in data]
    assert "".join(text) == completed["data"]["thought"] == THOUGHT
    assert "".join(thought) == completed["data"]["reasoning"] == REASONING
    assert len(text) > 1  # fragments as the model produced them (0.15 s apart), not one lump
    assert scripted_llm.failures == []
