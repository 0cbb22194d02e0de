"""The worker's Prometheus metrics: step, LLM and command latency, tokens, attempts, sandboxes.

They live in this process (one registry, `REGISTRY`) and are served by the
worker itself on `SANDHIVE_WORKER_METRICS_PORT` (`serve`). Cluster-wide figures
(tasks by status, queue depth and age, workers) are computed by the API's
`/metrics` from Postgres and Redis at scrape time (`app.api.metrics`).
Imported by app.worker and app.cli; imports nothing of Sandhive.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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


def observe_step(llm_ms: int, tool_ms: int, prompt_tokens: int, completion_tokens: int) -> None:
    """Record one finished step."""
    STEP_SECONDS.observe((llm_ms + tool_ms) / 1000)
    LLM_SECONDS.observe(llm_ms / 1000)
    if tool_ms:
        COMMAND_SECONDS.observe(tool_ms / 1000)
    TOKENS.labels("prompt").inc(prompt_tokens)
    TOKENS.labels("completion").inc(completion_tokens)


def serve(port: int, addr: str = "0.0.0.0") -> None:  # scraped from outside the host/container
    """Serve REGISTRY at http://addr:port/metrics from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
