"""Idempotency-Key repeats: the same submission gets its first task back, another one a 422.

A retry must be told apart from a key reused by mistake for a different task
(as payment APIs do), so a keyed task stores a fingerprint of what was
submitted: the parsed submission as canonical JSON, with each input file's
bytes hashed in instead of its base64. The JSON and the multipart form of one
submission therefore match, and so do spellings that differ only in key order,
in fields left at their defaults or in the order of the input files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from app.db import models
from app.errors import IdempotencyKeyReused
from app.schemas.tasks import TaskCreate


def fingerprint(body: TaskCreate, files: Sequence[tuple[str, bytes]]) -> str:
    """sha256 of the submission; `files` are its decoded input files (path, content)."""
    fields = body.model_dump(mode="json", exclude={"input_files"})
    inputs = sorted([path, hashlib.sha256(content).hexdigest()] for path, content in files)
    canonical = json.dumps(
        {"task": fields, "input_files": inputs}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_repeat(first: models.Task, key: str, submitted: str) -> None:
    """Refuse a key reused with a different submission; rows stored before fingerprints pass."""
    if first.idempotency_fingerprint in (None, submitted):
        return
    msg = f"Idempotency-Key {key!r} was used for a different submission ({first.id})"
    raise IdempotencyKeyReused(
        f"{msg}: a retry must send the same task, a new task needs a new key",
        details=[
            {"loc": ["header", "Idempotency-Key"], "msg": msg, "type": "idempotency_key_reused"}
        ],
    )
