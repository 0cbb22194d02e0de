"""The task list's filters (`q`, `model`, `metadata.KEY`, `created_after`/`created_before`,
`in_experiment`, `forked_from`).

Every filter is a plain predicate on the tenant's newest-first walk down the
(tenant_id, created_at) index, stopped at the page size: no trigram or GIN index is
assumed (pg_trgm is not always installed). A page costs at most the tenant's task count
in rows looked at, and usually far fewer, since the walk ends once a page is full. Both
the model and the metadata filters are JSONB containment, so a GIN index added later
would serve them unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, or_

from app.db import models
from app.errors import InvalidInput

METADATA_PREFIX = "metadata."
MAX_METADATA_FILTERS = 10
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 500
MAX_Q_CHARS = 200


@dataclass(frozen=True)
class TaskFilters:
    q: str | None = None
    """Case-insensitive substring of the prompt or of the id."""
    model: str | None = None
    """The task's resolved model (`llm.model` of its spec), exactly."""
    metadata: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """(key, value) pairs the task's metadata must all hold (top-level keys)."""
    created_after: datetime | None = None
    """Inclusive; a time without a zone is UTC."""
    created_before: datetime | None = None
    """Exclusive, so `created_after=X&created_before=Y` is the half-open interval [X, Y)."""
    in_experiment: bool | None = None
    """True: only the tasks that run experiments' items; False: only the others."""
    forked_from: str | None = None
    """Only the forks of this task (`POST /v1/tasks/{id}/fork`)."""

    def apply(self, query: Select[models.Task]) -> Select[models.Task]:
        task = models.Task
        if self.q:
            pattern = f"%{_like_escaped(self.q)}%"
            query = query.where(
                or_(task.prompt.ilike(pattern, escape="\\"), task.id.ilike(pattern, escape="\\"))
            )
        if self.model is not None:
            query = query.where(task.spec.contains({"llm": {"model": self.model}}))
        for key, value in self.metadata:
            query = query.where(_metadata_holds(key, value))
        if self.created_after is not None:
            query = query.where(task.created_at >= _aware(self.created_after))
        if self.created_before is not None:
            query = query.where(task.created_at < _aware(self.created_before))
        if self.forked_from is not None:
            query = query.where(task.parent_id == self.forked_from)
        if self.in_experiment is not None:  # by the items' unique task_id index
            linked = exists().where(models.ExperimentItem.task_id == task.id)
            query = query.where(linked if self.in_experiment else ~linked)
        return query


def metadata_filters(params: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The `metadata.KEY=VALUE` pairs among a query string's items; InvalidInput at the first
    bad one (an empty key, too many, too long, a NUL)."""
    pairs: list[tuple[str, str]] = []
    for name, value in params:
        if not name.startswith(METADATA_PREFIX):
            continue
        key = name[len(METADATA_PREFIX) :]
        loc = ("query", name[: MAX_KEY_CHARS + len(METADATA_PREFIX)])
        if not key:
            raise _bad(loc, "a metadata filter needs a key: metadata.KEY=VALUE")
        if len(key) > MAX_KEY_CHARS or len(value) > MAX_VALUE_CHARS:
            raise _bad(loc, f"key at most {MAX_KEY_CHARS}, value at most {MAX_VALUE_CHARS} chars")
        if "\x00" in key or "\x00" in value:
            raise _bad(loc, "NUL is not allowed")
        pairs.append((key, value))
    if len(pairs) > MAX_METADATA_FILTERS:
        raise _bad(("query", "metadata"), f"at most {MAX_METADATA_FILTERS} metadata filters")
    return tuple(pairs)


def iso_time(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 time from the query string (None when absent); InvalidInput at `name` if
    it is not one. Parsed here, not by pydantic, which would also take `0.5` as a Unix time."""
    if value is None:
        return None
    try:
        return _aware(datetime.fromisoformat(value))
    except ValueError:
        raise _bad(("query", name), "not an ISO 8601 time (e.g. 2026-12-01T09:00:00Z)") from None


def _metadata_holds(key: str, value: str) -> ColumnElement[bool]:
    """The value as a string, or as the JSON scalar it spells (`7`, `true`, `null`): a query
    string has no types, and `{"ticket": 7}` should be found by `metadata.ticket=7`."""
    meta = models.Task.meta
    as_string = meta.contains({key: value})
    scalar = _json_scalar(value)
    if scalar is _NOT_SCALAR:
        return as_string
    return or_(as_string, meta.contains({key: scalar}))


_NOT_SCALAR = object()


def _json_scalar(value: str) -> Any:
    try:
        parsed = json.loads(value)
    except ValueError:
        return _NOT_SCALAR
    if parsed is None or isinstance(parsed, bool | int):
        return parsed
    if isinstance(parsed, float) and math.isfinite(parsed):
        return parsed
    return _NOT_SCALAR


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _bad(loc: tuple[str, ...], msg: str) -> InvalidInput:
    where = ".".join(loc[1:])
    detail = {"loc": list(loc), "msg": msg, "type": "invalid"}
    return InvalidInput(f"{where}: {msg}", details=[detail])
