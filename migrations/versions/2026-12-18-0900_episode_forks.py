"""episode forks: a child episode's parent and the step it went on from.

Revision ID: b4e8f2a6d9c3
Revises: a7d3e9c5b1f4
Create Date: 2026-12-18 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b4e8f2a6d9c3"
down_revision: str | None = "a7d3e9c5b1f4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding them rewrites nothing; an earlier release ignores them.
    op.add_column("episodes", sa.Column("parent_id", sa.String(length=40), nullable=True))
    op.add_column("episodes", sa.Column("fork_step", sa.Integer(), nullable=True))
    op.create_index("ix_episodes_parent_id", "episodes", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_episodes_parent_id", table_name="episodes")
    op.drop_column("episodes", "fork_step")
    op.drop_column("episodes", "parent_id")
