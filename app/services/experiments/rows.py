"""Where an item's dataset row is read from: the experiment's `experiment_rows` (one copy
per row), or the item's own copy for items an earlier release wrote (migration
`experiment_rows`). Every reader of a row goes through `ROW` and `with_rows`, so the day
the old column is dropped only this module changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVarTuple

from sqlalchemy import Select, and_, func, insert
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models

Item = models.ExperimentItem
Row = models.ExperimentRow
ROW_VALUE = func.coalesce(Row.row, Item.own_row, type_=JSONB)
"""An item's row, in a query made by `with_rows` (`ROW_VALUE["domain"]`: one field)."""
ROW = ROW_VALUE.label("row")
Ts = TypeVarTuple("Ts")


def with_rows(query: Select[*Ts]) -> Select[*Ts]:
    """`query` (over items) joined to their rows, so it may select `ROW`."""
    return query.outerjoin_from(
        Item, Row, and_(Row.experiment_id == Item.experiment_id, Row.row_id == Item.row_id)
    )


async def store_rows(
    session: AsyncSession, experiment_id: str, rows: Iterable[Mapping[str, Any]]
) -> None:
    """Each row once, by its `id`."""
    values = [{"experiment_id": experiment_id, "row_id": r["id"], "row": dict(r)} for r in rows]
    if values:
        await session.execute(insert(Row), values)
