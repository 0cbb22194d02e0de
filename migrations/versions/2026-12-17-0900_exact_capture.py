"""exact capture: a step's `llm.capture` stored as `json`, its keys in the order sent.

`jsonb` sorts an object's keys (by length, then bytes), so a captured request's tools and
messages came back reordered, and a chat template rendered them into another prompt than
the model saw. `json` keeps the text as written. A new column, not a type change: changing
the type would rewrite every step row under an exclusive lock. Rows stored before keep
their `capture` (`jsonb`), which the export still reads.

Revision ID: a7d3e9c5b1f4
Revises: f2b8d4a6c1e3
Create Date: 2026-12-17 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7d3e9c5b1f4"
down_revision: str | None = "f2b8d4a6c1e3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing. An earlier release neither writes
    # nor reads it (after a rollback, captures made since are not exported).
    op.add_column("steps", sa.Column("capture_json", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("steps", "capture_json")
