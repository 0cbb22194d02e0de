"""task_reliability: lost attempts and cancel requests on tasks.

Revision ID: 5c1d2e7a9b40
Revises: 073e38ac4b57
Create Date: 2026-12-01 12:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c1d2e7a9b40"
down_revision: str | None = "073e38ac4b57"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column("lost_attempts", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "tasks", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("tasks", "cancel_requested_at")
    op.drop_column("tasks", "lost_attempts")
