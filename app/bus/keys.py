"""Every Redis key and stream name Sandhive uses, spelled once."""

from __future__ import annotations

PREFIX = "sandhive"
TASK_STREAM = f"{PREFIX}:tasks"
WORKER_GROUP = "workers"
IMAGE_STREAM_PREFIX = f"{PREFIX}:tasks:image:"
"""Tasks of a catalogue image other than `default` wait on their own stream (`task_stream`)."""
STREAM_REGISTRY = f"{PREFIX}:tasks:streams"
"""A set of every task stream ever written (enqueue, ensure_group, a requeue): read instead
of a keyspace SCAN by `/metrics` and reconciliation."""
DEAD_LETTERS = f"{PREFIX}:tasks:dead"
"""Queue entries no worker can act on (malformed), kept for an operator to read."""
RECONCILE_LOCK = f"{PREFIX}:reconcile:lock"
"""Held by the one worker reconciling Redis with Postgres right now."""


def task_stream(image: str) -> str:
    """The queue of the tasks of one catalogue image: `default`'s is the original stream, so
    a deployment without a catalogue uses exactly the keys it always did."""
    return TASK_STREAM if image == "default" else f"{IMAGE_STREAM_PREFIX}{image}"


def image_of(stream: str) -> str:
    """The catalogue image whose tasks wait on `stream` (`task_stream`'s inverse)."""
    if stream.startswith(IMAGE_STREAM_PREFIX):
        return stream[len(IMAGE_STREAM_PREFIX) :]
    return "default"


def live_events(task_id: str) -> str:
    """Per-task stream of every event (durable and live-only) for followers."""
    return f"{PREFIX}:task:{task_id}:live"


def cancel_flag(task_id: str) -> str:
    """Set by the API when a running task is cancelled; the worker running it polls it."""
    return f"{PREFIX}:task:{task_id}:cancel"


def task_lease(task_id: str) -> str:
    """Who runs the task now ("worker|message id"); expires unless its worker renews it."""
    return f"{PREFIX}:task:{task_id}:lease"


def episode_scoring(episode_id: str) -> str:
    """Held (with a TTL, renewed) by the worker scoring the ended episode's answer with a
    deferred scorer, until the reward is stored (`app.bus.episodes.hold_scoring`)."""
    return f"{PREFIX}:episode:{episode_id}:scoring"


def worker_heartbeat(name: str) -> str:
    """Present while the worker `name` is alive; expires when it stops renewing it."""
    return f"{PREFIX}:worker:{name}"


def drain_flag(worker: str) -> str:
    """Set by `sandhive admin drain`; the worker stops claiming once it sees it."""
    return f"{PREFIX}:drain:{worker}"


def rate_bucket(tenant: str) -> str:
    """The tenant's request-rate token bucket (app/bus/ratelimit.py)."""
    return f"{PREFIX}:ratelimit:{tenant}"


def stream_slots(tenant: str) -> str:
    """The tenant's open event streams, scored by expiry (app/bus/streamslots.py)."""
    return f"{PREFIX}:streams:{tenant}"


def experiment_events(experiment_id: str) -> str:
    """Pub/sub channel: the newest committed event `seq` of an experiment."""
    return f"{PREFIX}:experiment:{experiment_id}:events"
