"""Every Redis key and stream name Sandhive uses, spelled once."""

from __future__ import annotations

PREFIX = "sandhive"
TASK_STREAM = f"{PREFIX}:tasks"
WORKER_GROUP = "workers"
DEAD_LETTERS = f"{PREFIX}:tasks:dead"
"""Queue entries no worker can act on (malformed), kept for an operator to read."""
RECONCILE_LOCK = f"{PREFIX}:reconcile:lock"
"""Held by the one worker reconciling Redis with Postgres right now."""


def live_events(task_id: str) -> str:
    """Per-task stream of every event (durable and live-only) for followers."""
    return f"{PREFIX}:task:{task_id}:live"


def cancel_flag(task_id: str) -> str:
    """Set by the API when a running task is cancelled; the worker running it polls it."""
    return f"{PREFIX}:task:{task_id}:cancel"


def task_lease(task_id: str) -> str:
    """Who runs the task now ("worker|message id"); expires unless its worker renews it."""
    return f"{PREFIX}:task:{task_id}:lease"


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
