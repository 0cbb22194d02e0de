"""episode trajectory: an ended episode's steps, written once as it ends (for ATIF).

Revision ID: c4f7a2d9e8b1
Revises: b9d4e2f6a1c3
Create Date: 2026-12-13 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "c4f7a2d9e8b1"
down_revision: str | None = "b9d4e2f6a1c3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and older releases never write it
    # (their episodes have no stored trajectory, which the API says).
    op.add_column("episodes", sa.Column("trajectory", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("episodes", "trajectory")
