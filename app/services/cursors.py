"""Opaque page cursors for newest-first lists: `(created_at, id)` of the last row sent.

The task list and the experiment list page the same way, so a client's cursor handling
works for both, and a tampered cursor is the same 422 on either.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime

from app.errors import InvalidInput


def encode_cursor(created_at: datetime, row_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The `(created_at, id)` a cursor holds; InvalidInput (422 at `["query", "cursor"]`,
    where the request carried it) if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, row_id = json.loads(raw)
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None or not isinstance(row_id, str) or "\x00" in row_id:
            raise ValueError("cursor without a time zone or a usable id")
        return when, row_id
    except (ValueError, TypeError) as exc:
        where = {"loc": ["query", "cursor"], "msg": "bad cursor", "type": "invalid"}
        raise InvalidInput("cursor: bad cursor", details=[where]) from exc
