"""artifacts_skipped: output files left out of a task's artifacts, and why.

Revision ID: 4f8a1c6d2e93
Revises: 9e4b7c2d1a63
Create Date: 2026-12-03 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "4f8a1c6d2e93"
down_revision: str | None = "9e4b7c2d1a63"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column(
            "artifacts_skipped",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("tasks", "artifacts_skipped")
