"""A captured rollout against llama.cpp, through a recording proxy that keeps every request
body as it crossed the wire: the export's request messages and tools of every turn are that
JSON, key for key in the order sent, and each turn's completion ids are what llama.cpp
sampled (its logprob entries), one per logprob."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.real_llm.conftest import ALIAS, RealServer
from tests.real_llm.test_real_llm import EXTRA_BODY, LIST_FILES, SHORT_SYSTEM, WORKER_WAIT_S


class Proxy:
    """Forwards POSTs to the real server and keeps each request body's bytes."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: list[bytes] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                proxy.bodies.append(body)
                headers = {"Content-Type": "application/json"}
                answer = httpx.post(
                    proxy.upstream + self.path, content=body, headers=headers, timeout=600
                )
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def proxy(real_llm: RealServer) -> Iterator[Proxy]:
    recording = Proxy(real_llm.base_url.removesuffix("/v1"))
    thread = threading.Thread(target=recording.server.serve_forever, daemon=True)
    thread.start()
    yield recording
    recording.server.shutdown()
    recording.server.server_close()  # its listening socket, not left to the collector


def ordered(text: str | bytes) -> Any:
    """JSON with every object as its (key, value) pairs in the order written."""
    return json.loads(text, object_pairs_hook=list)


async def test_a_captured_rollout_exports_the_requests_as_they_were_sent(
    make_settings: Callable[..., Settings], docker_image: str, proxy: Proxy, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        f'[profiles.recorded]\nbase_url = "{proxy.base_url}"\nmodel = "{ALIAS}"\nstream = false\n'
    )
    settings = make_settings(
        sandbox_image=docker_image,
        llm_profiles_file=profiles,
        llm_max_retries=0,
        worker_concurrency=1,
    )
    task = {
        "prompt": LIST_FILES,
        "llm": {
            "profile": "recorded",
            "capture": True,
            "temperature": 0,
            "max_tokens_per_call": 60,
            "extra_body": EXTRA_BODY,
        },
        "limits": {"max_steps": 2, "timeout_s": 600},
        "prompt_config": {"system": SHORT_SYSTEM},
    }
    async with serve(create_app(settings)) as api:
        created = await api.post("/v1/tasks", json=task)
        assert created.status_code == 202, created.text
        await asyncio.wait_for(Worker(settings).run(burst=True), WORKER_WAIT_S)
        line = json.loads((await api.get(f"/v1/tasks/{created.json()['id']}/export")).text)
    sent = [json.loads(body) for body in proxy.bodies]
    assert len(sent) == len(line["turns"]) >= 1, (len(sent), line["status"], line["error"])
    assert line["captured"] is True
    for body, raw, turn in zip(sent, proxy.bodies, line["turns"], strict=True):
        wire = dict(ordered(raw))
        request = line["messages"][: turn["request_messages"]]
        assert ordered(json.dumps(request)) == wire["messages"]
        assert ordered(json.dumps(line["tools"])) == wire["tools"]
        assert body["logprobs"] is True
        ids, logprobs = turn["completion_token_ids"], turn["logprobs"]
        assert ids, turn
        assert len(ids) == len(logprobs)
