"""task verification: what a task's verifier (Harbor's tests/test.sh) found.

Revision ID: f2b8d4a6c1e3
Revises: e5c9a1f3b7d2
Create Date: 2026-12-16 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "f2b8d4a6c1e3"
down_revision: str | None = "e5c9a1f3b7d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and an older release never writes it
    # (it ignores a task's `verifier`, which only this release accepts).
    op.add_column("tasks", sa.Column("verification", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "verification")
