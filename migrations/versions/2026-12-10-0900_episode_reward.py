"""episode reward: a deferred scorer's result (llm_judge, python), written by the worker.

Revision ID: f7c3d9a1b2e4
Revises: e5f1a2b3c4d6
Create Date: 2026-12-10 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "f7c3d9a1b2e4"
down_revision: str | None = "e5f1a2b3c4d6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and older releases never write it.
    op.add_column("episodes", sa.Column("reward", postgresql.JSONB(), nullable=True))
    # Partial: only submitted answers of a deferred scorer still without a reward.
    op.create_index(
        "ix_episodes_unscored",
        "episodes",
        ["worker"],
        postgresql_where=sa.text(
            "reward IS NULL AND finish_reason = 'submitted' "
            "AND (scorer ->> 'kind') IN ('llm_judge', 'python')"
        ),
    )


def downgrade() -> None:
    op.drop_index("ix_episodes_unscored", table_name="episodes")
    op.drop_column("episodes", "reward")
