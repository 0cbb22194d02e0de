"""The worker's Prometheus metrics: step, LLM and command latency, tokens, attempts, sandboxes,
and the time and errors of experiment scorers.

They live in this process (one registry, `REGISTRY`) and are served by the
worker itself on `SANDHIVE_WORKER_METRICS_PORT` (`serve`, with its /healthz and
/readyz). Cluster-wide figures
(tasks by status, queue depth and age, workers) are computed by the API's
`/metrics` from Postgres and Redis at scrape time (`app.api.metrics`).
Imported by app.worker, app.cli.main, app.runner.episode (the sandbox start time; under
`sandhive run` it is recorded and never served) and the experiment runner (scorer time,
also recorded, never served, when the API advances an experiment); imports nothing of
Sandhive.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment
    from wsgiref.types import WSGIApplication as WSGIApp

REGISTRY = CollectorRegistry()
_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

STEP_SECONDS = Histogram(
    "sandhive_worker_step_seconds",
    "One agent step: LLM call + tool.",
    buckets=_LATENCY,
    registry=REGISTRY,
)
LLM_SECONDS = Histogram(
    "sandhive_worker_llm_seconds", "One LLM call.", buckets=_LATENCY, registry=REGISTRY
)
COMMAND_SECONDS = Histogram(
    "sandhive_worker_command_seconds",
    "One tool call in the sandbox.",
    buckets=_LATENCY,
    registry=REGISTRY,
)
TOKENS = Counter("sandhive_worker_tokens", "LLM tokens used.", ["kind"], registry=REGISTRY)
ATTEMPTS = Counter(
    "sandhive_worker_attempts",
    "Attempts this worker ended, by how (done, retry, stale, hand_back).",
    ["end"],
    registry=REGISTRY,
)
RECLAIMED = Counter(
    "sandhive_worker_reclaimed", "Tasks taken over from a dead worker.", registry=REGISTRY
)
RUNNING = Gauge(
    "sandhive_worker_running_sandboxes", "Attempts (sandboxes) running now.", registry=REGISTRY
)
SLOTS = Gauge("sandhive_worker_slots", "Attempts this worker may run at once.", registry=REGISTRY)
SANDBOX_START_SECONDS = Histogram(
    "sandhive_worker_sandbox_start_seconds",
    "From asking for a sandbox to it being ready for the first command (inputs copied in),"
    " by source: warm (claimed from the warm pool) or cold (created for the task).",
    ["source"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60),
    registry=REGISTRY,
)
SANDBOXES_LIVE = Gauge(
    "sandhive_worker_api_sandboxes",
    "Sandboxes of /v1/sandboxes this worker holds now.",
    registry=REGISTRY,
)
SANDBOX_COMMANDS = Counter(
    "sandhive_worker_api_sandbox_commands",
    "Commands run in /v1/sandboxes sandboxes.",
    registry=REGISTRY,
)
SANDBOX_COMMAND_SECONDS = Histogram(
    "sandhive_worker_api_sandbox_command_seconds",
    "One command in a /v1/sandboxes sandbox, as the worker ran it.",
    buckets=(0.005, 0.01, 0.025, *_LATENCY),
    registry=REGISTRY,
)
IMAGE_BUILD_SECONDS = Histogram(
    "sandhive_worker_image_build_seconds",
    "One build of a tenant's image (/v1/images/builds), by outcome: built or failed.",
    ["outcome"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900),
    registry=REGISTRY,
)
LIVE_EVENTS_DROPPED = Counter(
    "sandhive_live_events_dropped",
    "Live-only events that never reached followers, by reason (publish_failed: Redis refused"
    " it; backlog: the worker's writer was too far behind, Postgres or Redis being slow; the"
    " API's /metrics adds slow_client for viewers cut off by their full buffer).",
    ["reason"],
    registry=REGISTRY,
)
SCORER_SECONDS = Histogram(
    "sandhive_worker_scorer_seconds",
    "Scoring one experiment answer, by scorer kind (math, llm_judge, python, ...).",
    ["kind"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
SCORER_ERRORS = Counter(
    "sandhive_worker_scorer_errors",
    "Experiment answers a scorer could not judge (items ending `error` of kind scorer),"
    " by scorer kind.",
    ["kind"],
    registry=REGISTRY,
)
EGRESS_BLOCKED = Counter(
    "sandhive_worker_egress_blocked",
    "Connections the egress proxy refused for this worker's sandboxes (each is also a task"
    " event `network.blocked`).",
    registry=REGISTRY,
)
for _source in ("warm", "cold"):  # every series shows from the first scrape, at 0
    SANDBOX_START_SECONDS.labels(_source)
for _outcome in ("built", "failed"):
    IMAGE_BUILD_SECONDS.labels(_outcome)
LIVE_EVENTS_DROPPED.labels("publish_failed")
LIVE_EVENTS_DROPPED.labels("backlog")


def observe_step(llm_ms: int, tool_ms: int, prompt_tokens: int, completion_tokens: int) -> None:
    """Record one finished step."""
    STEP_SECONDS.observe((llm_ms + tool_ms) / 1000)
    LLM_SECONDS.observe(llm_ms / 1000)
    if tool_ms:
        COMMAND_SECONDS.observe(tool_ms / 1000)
    TOKENS.labels("prompt").inc(prompt_tokens)
    TOKENS.labels("completion").inc(completion_tokens)


@contextmanager
def scoring(kind: str) -> Iterator[None]:
    """Time one scoring of `kind`; a `ScorerError` (any exception) through it is counted."""
    started = time.monotonic()
    try:
        yield
    except Exception:
        SCORER_ERRORS.labels(kind).inc()
        raise
    finally:
        SCORER_SECONDS.labels(kind).observe(time.monotonic() - started)


def observe_sandbox_start(seconds: float, *, warm: bool) -> None:
    """Record how long one task waited for its sandbox."""
    SANDBOX_START_SECONDS.labels("warm" if warm else "cold").observe(seconds)


def serve(
    port: int,
    addr: str = "0.0.0.0",  # scraped from outside the host/container
    readiness: Callable[[], Mapping[str, str]] | None = None,
) -> None:
    """Serve REGISTRY at http://addr:port/metrics, plus /healthz and /readyz, from threads.

    `readiness` returns the latest result of each backend check ("ok" or why not);
    it must not block: the checks themselves run on the worker's event loop and
    this thread only reads what they found (`app.worker.health`).
    """
    app = _routes(make_wsgi_app(REGISTRY), readiness)
    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


def _routes(metrics_app: WSGIApp, readiness: Callable[[], Mapping[str, str]] | None) -> WSGIApp:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _json(start_response, 200, {"status": "ok"})
        if path == "/readyz":
            checks = dict(readiness()) if readiness is not None else {}
            ready = all(state == "ok" for state in checks.values())
            body = {"status": "ok" if ready else "not_ready", **checks}
            return _json(start_response, 200 if ready else 503, body)
        return metrics_app(environ, start_response)

    return app


def _json(start_response: StartResponse, code: int, body: Mapping[str, str]) -> list[bytes]:
    data = json.dumps(body).encode()
    status = "200 OK" if code == 200 else f"{code} Service Unavailable"
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: Any) -> None:
        return
