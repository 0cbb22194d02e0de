"""A finished step stored as one SQL statement: the hot path's only write to Postgres.

A step's store used to be a transaction of three statements (the fenced `last_seq` bump,
the events, the step row): eight round trips with the pool's ping of then (itself BEGIN,
`;` and ROLLBACK), BEGIN and COMMIT, and most of the worker's CPU per step went to
SQLAlchemy compiling and running them (docs/performance.md, "A step's store as one
statement"). Here the three are data-modifying CTEs of one statement, sent as written
(`exec_driver_sql`: nothing compiled) on a connection in autocommit: one statement is its
own transaction, so it is as atomic as the three were, and Postgres runs every CTE once
whether or not the final SELECT reads it.

The fence is the bump's WHERE: when this attempt no longer owns the task, the bump
updates no row, so the inserts (which select FROM the bump) insert none, and no `seq` is
taken (invariant 3: no gaps). The events' payloads travel as one JSON array.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.db.engine import Sessions, autocommit
from app.states import TaskStatus

STORE_STEP = f"""
WITH bump AS (
    UPDATE tasks SET last_seq = last_seq + $3::int
    WHERE id = $1::varchar AND attempt = $2::int AND status = '{TaskStatus.running.value}'
    RETURNING last_seq
), stored_events AS (
    INSERT INTO events (task_id, seq, type, ts, data)
    SELECT $1::varchar, bump.last_seq - $3::int + item.n, item.value->>'type', $4::timestamptz,
           item.value->'data'
    FROM bump, jsonb_array_elements($5::jsonb) WITH ORDINALITY AS item(value, n)
), stored_step AS (
    INSERT INTO steps (task_id, attempt, "index", thought, reasoning, action, observation,
                       exit_code, started_at, llm_ms, tool_ms, prompt_tokens,
                       completion_tokens, interrupted, capture_json, message)
    SELECT $1::varchar, $2::int, $6::int, $7::text, $8::text, $9::jsonb, $10::text,
           $11::int, $12::timestamptz, $13::int, $14::int, $15::int,
           $16::int, $17::varchar, $18::json, $19::json
    FROM bump
)
SELECT last_seq FROM bump
"""


async def store_step(
    sessions: Sessions,
    task_id: str,
    attempt: int,
    step: Mapping[str, Any],
    started_at: datetime,
    events: Sequence[tuple[str, Mapping[str, Any]]],
    ts: datetime,
    *,
    capture: Mapping[str, Any] | None,
    message: Mapping[str, Any] | None,
) -> int | None:
    """Store `step` (a StepOut dumped as JSON, made storable) and `events` after it;
    the task's new `last_seq`, or None when `attempt` no longer runs the task.

    A missing action, capture or message is stored as JSON `null`, as the ORM's JSON
    columns (`none_as_null=False`) always stored it, not as SQL NULL.
    """
    items = [{"type": type_, "data": data} for type_, data in events]
    action = step["action"]
    params = (
        task_id,
        attempt,
        len(items),
        ts,
        json.dumps(items),
        step["index"],
        step["thought"],
        step["reasoning"],
        json.dumps(action),
        step["observation"],
        step["exit_code"],
        started_at,
        step["llm_ms"],
        step["tool_ms"],
        step["prompt_tokens"],
        step["completion_tokens"],
        step["interrupted"],
        json.dumps(capture),
        json.dumps(message),
    )
    async with autocommit(sessions).connect() as conn:
        last = (await conn.exec_driver_sql(STORE_STEP, params)).scalar()
    return None if last is None else int(last)
