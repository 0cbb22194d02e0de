"""The vocabulary of a task's life: statuses and finish reasons. A leaf: stdlib only."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class FinishReason(StrEnum):
    submitted = "submitted"
    max_steps = "max_steps"
    timeout = "timeout"
    context_limit = "context_limit"
    llm_error = "llm_error"
    sandbox_error = "sandbox_error"
    cancelled = "cancelled"
    worker_lost = "worker_lost"
    replay_diverged = "replay_diverged"
    """A fork rebuilt by replay saw a tool answer other than the recorded one (the
    service's report, not the model's doing: nothing of the child's own ran yet)."""


TERMINAL = frozenset({TaskStatus.succeeded, TaskStatus.failed, TaskStatus.cancelled})


def is_terminal(status: TaskStatus) -> bool:
    return status in TERMINAL


def status_for(reason: FinishReason) -> TaskStatus:
    """`succeeded` only for `submitted` (API.md); `cancelled` for cancel; else `failed`."""
    if reason is FinishReason.submitted:
        return TaskStatus.succeeded
    if reason is FinishReason.cancelled:
        return TaskStatus.cancelled
    return TaskStatus.failed


def timeout_error(timeout_s: float | None) -> str:
    """The `error` of a task ended by its `timeout_s`, wherever the clock ran out."""
    return f"task exceeded its timeout of {timeout_s} s"
