"""Prefixed, time-ordered identifiers and the one clock. A leaf: stdlib only."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _ulid() -> str:
    """26 characters: 48 bits of milliseconds then 80 random bits, sortable by time."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_task_id() -> str:
    return f"tsk_{_ulid()}"


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_experiment_id() -> str:
    return f"exp_{_ulid()}"


def new_sandbox_id() -> str:
    return f"sbx_{_ulid()}"


def new_command_id() -> str:
    return f"cmd_{_ulid()}"
