"""Opaque page cursors for newest-first lists: `(created_at, id)` of the last row sent.

The task list and the experiment list page the same way, so a client's cursor handling
works for both, and a tampered cursor is the same 422 on either.

A cursor is `<created_at in microseconds since 1970, 18 digits>-<id>`: a form that
`CURSOR_PATTERN` describes exactly, so that every string the OpenAPI document admits is a
cursor the server reads (a generator or fuzzer that trusts the schema never meets a 422).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.errors import InvalidInput

CURSOR_PATTERN = r"^[01][0-9]{17}-[A-Za-z0-9_]{1,64}$"
"""The `cursor` query parameter's pattern: 18 digits (up to the year 8300) and an id."""
_CURSOR = re.compile(CURSOR_PATTERN)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_cursor(created_at: datetime, row_id: str) -> str:
    micros = (created_at - EPOCH) // timedelta(microseconds=1)
    return f"{micros:018d}-{row_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The `(created_at, id)` a cursor holds; InvalidInput (422 at `["query", "cursor"]`,
    where the request carried it) if it is not one (the API's pattern refuses those first)."""
    if not _CURSOR.fullmatch(cursor):
        where = {"loc": ["query", "cursor"], "msg": "bad cursor", "type": "invalid"}
        raise InvalidInput("cursor: bad cursor", details=[where])
    micros, _, row_id = cursor.partition("-")
    return EPOCH + timedelta(microseconds=int(micros)), row_id
