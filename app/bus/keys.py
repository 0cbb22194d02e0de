"""Every Redis key and stream name Sandhive uses, spelled once."""

from __future__ import annotations

PREFIX = "sandhive"
TASK_STREAM = f"{PREFIX}:tasks"
WORKER_GROUP = "workers"


def live_events(task_id: str) -> str:
    """Per-task stream of every event (durable and live-only) for followers."""
    return f"{PREFIX}:task:{task_id}:live"


def cancel_flag(task_id: str) -> str:
    return f"{PREFIX}:task:{task_id}:cancel"
