"""ATIF out: a task's trajectory as one document, an experiment's as a zip of a folder.

Built from the same records as the JSONL export (`export.Record`), so the two never
disagree on turns, token ids or rewards. The zip is streamed: each trajectory is added
as it is built and the bytes written so far are sent, so an experiment of any size
costs one page of records in memory (`export.EXPORT_PAGE`).
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import AsyncIterator
from typing import Any

from app import __version__
from app.db.engine import Sessions
from app.domain.atif import atif_trajectory
from app.services.rollouts.export import Record, open_experiment_records, rollout_line, task_record

SAFE = re.compile(r"[^A-Za-z0-9._-]")


async def task_atif(
    sessions: Sessions, tenant: str, task_id: str, attempt: int | None = None
) -> dict[str, Any]:
    """The tenant's task (its latest worker attempt, or `attempt`) as an ATIF trajectory."""
    record = await task_record(sessions, tenant, task_id, attempt=attempt, with_prompt=True)
    return record_atif(record, attempt)


def record_atif(record: Record, attempt: int | None = None) -> dict[str, Any]:
    """`attempt`: the worker attempt whose steps `record` holds (None: the latest)."""
    return atif_trajectory(
        rollout_line(record),
        record.task.prompt,
        record.steps,
        agent_version=__version__,
        worker_attempt=record.task.attempt if attempt is None else attempt,
    )


async def open_experiment_atif(
    sessions: Sessions, tenant: str, experiment_id: str, arm: str | None = None
) -> AsyncIterator[bytes]:
    """The experiment (or one arm of it) as a zip: `<experiment>/<arm>/<row>-<attempt>.json`
    per started item (NotFound before the first byte for another tenant's)."""
    records = await open_experiment_records(
        sessions, tenant, experiment_id, arm=arm, with_prompt=True
    )
    return _zipped(experiment_id, records)


class _Chunks:
    """A write-only file that hands over what was written since it was last drained."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes, /) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def drain(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


async def _zipped(experiment_id: str, records: AsyncIterator[Record]) -> AsyncIterator[bytes]:
    sink = _Chunks()
    taken: set[str] = set()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        async for record in records:
            name = entry_name(experiment_id, record, taken)
            taken.add(name)
            archive.writestr(name, json.dumps(record_atif(record), ensure_ascii=False, indent=2))
            yield sink.drain()
    yield sink.drain()  # the central directory, written on close


def entry_name(experiment_id: str, record: Record, taken: set[str]) -> str:
    """`<experiment>/<arm>/<row>-<attempt>.json`, the row id made safe for a file name; the
    task id is added when two rows' safe names meet."""
    item = record.placed[0] if record.placed else None
    arm = item.arm if item else "_"
    row = SAFE.sub("_", item.row_id) if item else record.task.id
    attempt = item.attempt if item else 1
    name = f"{experiment_id}/{arm}/{row}-{attempt}.json"
    return (
        name
        if name not in taken
        else f"{experiment_id}/{arm}/{row}-{attempt}-{record.task.id}.json"
    )
