"""`GET /metrics`: the deployment's figures in Prometheus text format, computed at scrape time.

From Postgres: tasks by status, failed tasks by finish reason, the oldest
queued task's age, lost (reclaimed) attempts, experiments and their items by
status. From Redis: the task streams'
length, per image what waits unread, its age and the live workers that have the image
(`services.image_figures`), live workers with their slots and busy slots. From this API process:
stream viewers (WebSocket and SSE clients), live feeds, and the slow viewers
cut off with the live events they never got (`LiveHub.losses`). Per-step
histograms (step, LLM and command latency, tokens) are the worker's own, on
`SANDHIVE_WORKER_METRICS_PORT` (`app.metrics`). Unauthenticated, like
`/healthz`: keep it off the public listener (it names no tenant or task).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.api.deps import Res
from app.api.tasks.stream import get_hub
from app.resources import Resources
from app.services.admin import image_figures
from app.services.admin import service as admin
from app.services.experiments.figures import experiment_figures
from app.states import TaskStatus

router = APIRouter(tags=["ops"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, res: Res) -> Response:
    families = await _families(request, res)
    registry = CollectorRegistry()
    registry.register(_Fixed(families))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def _families(request: Request, res: Res) -> list[Metric]:
    figures = await admin.task_figures(res.sessions)
    workers = await admin.list_workers(res.redis)
    depth = await admin.stream_length(res.redis)
    tasks = GaugeMetricFamily("sandhive_tasks", "Tasks by status.", labels=["status"])
    for status in TaskStatus:
        tasks.add_metric([status.value], figures.by_status.get(status.value, 0))
    failed = GaugeMetricFamily(
        "sandhive_tasks_failed", "Failed tasks by finish reason.", labels=["finish_reason"]
    )
    for reason, count in sorted(figures.failed_by_reason.items()):
        failed.add_metric([reason], count)
    slots = GaugeMetricFamily("sandhive_worker_slots_total", "Slots per worker.", labels=["worker"])
    busy = GaugeMetricFamily("sandhive_worker_busy", "Busy slots per worker.", labels=["worker"])
    for worker in workers:
        slots.add_metric([worker.name], worker.slots)
        busy.add_metric([worker.name], worker.busy)
    hub = get_hub(request)
    stats, losses = hub.stats(), hub.losses()
    dropped = CounterMetricFamily(
        "sandhive_live_events_dropped",
        "Live events not delivered, by reason (slow_client: to viewers cut off as too slow;"
        " durable ones they replay on reconnect). Workers add publish_failed.",
        labels=["reason"],
    )
    dropped.add_metric(["slow_client"], losses["dropped_events"])
    return [
        *await _experiment_families(res),
        *await _image_families(res, workers),
        dropped,
        CounterMetricFamily(
            "sandhive_stream_clients_dropped",
            "Viewers this API process cut off for falling behind (WebSocket 4408 / SSE end).",
            value=losses["slow_viewers"],
        ),
        tasks,
        failed,
        slots,
        busy,
        _gauge(
            "sandhive_queue_depth", "Queued tasks (Postgres).", figures.by_status.get("queued", 0)
        ),
        _gauge("sandhive_queue_stream_length", "Entries in the Redis task stream.", depth),
        _gauge(
            "sandhive_queue_oldest_age_seconds",
            "Age of the oldest queued task.",
            figures.oldest_queued_age_s,
        ),
        _gauge(
            "sandhive_running_sandboxes",
            "Running attempts, each in its own sandbox.",
            figures.by_status.get("running", 0),
        ),
        _gauge(
            "sandhive_lost_attempts",
            "Attempts lost to dead workers (reclaimed).",
            figures.lost_attempts,
        ),
        _gauge("sandhive_workers", "Workers with a live heartbeat.", len(workers)),
        _gauge(
            "sandhive_stream_clients",
            "WebSocket/SSE viewers on this API process.",
            stats["viewers"],
        ),
        _gauge(
            "sandhive_stream_feeds", "Redis live feeds read by this API process.", stats["readers"]
        ),
    ]


async def _experiment_families(res: Resources) -> list[Metric]:
    figures = await experiment_figures(res.sessions)
    experiments = GaugeMetricFamily(
        "sandhive_experiments", "Experiments by status.", labels=["status"]
    )
    for status, count in figures.experiments.items():
        experiments.add_metric([status], count)
    items = GaugeMetricFamily(
        "sandhive_experiment_items", "Experiment items by status.", labels=["status"]
    )
    for status, count in figures.items.items():
        items.add_metric([status], count)
    return [experiments, items]


async def _image_families(res: Resources, workers: list[admin.WorkerInfo]) -> list[Metric]:
    """Per image: what waits, for how long, and how many live workers could run it (0 with
    tasks waiting: they wait until a worker with the image starts; docs/images.md)."""
    waiting = GaugeMetricFamily(
        "sandhive_image_waiting", "Tasks waiting on an image's stream, unread.", labels=["image"]
    )
    oldest = GaugeMetricFamily(
        "sandhive_image_oldest_waiting_age_seconds",
        "Age of the oldest task waiting on an image's stream.",
        labels=["image"],
    )
    having = GaugeMetricFamily(
        "sandhive_image_workers", "Live workers whose daemon has the image.", labels=["image"]
    )
    for row in await image_figures.image_queues(res.redis, res.settings, workers):
        waiting.add_metric([row.image], row.waiting)
        oldest.add_metric([row.image], row.oldest_age_s)
        having.add_metric([row.image], row.workers)
    return [waiting, oldest, having]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class _Fixed(Collector):
    """A collector that yields figures already computed."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
