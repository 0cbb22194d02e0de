"""episodes: RL environments driven step by step by a trainer.

Revision ID: c4a7e2b91d05
Revises: 8d2b6e0f3a51
Create Date: 2026-12-07 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "c4a7e2b91d05"
down_revision: str | None = "8d2b6e0f3a51"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "episodes",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("scorer", postgresql.JSONB(), nullable=True),
        sa.Column("ground_truth", postgresql.JSONB(), nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_kind", sa.String(16), nullable=True),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("ended_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
    )
    op.create_index("ix_episodes_tenant_status", "episodes", ["tenant_id", "status"])
    op.create_index("ix_episodes_worker_status", "episodes", ["worker", "status"])


def downgrade() -> None:
    op.drop_index("ix_episodes_worker_status", table_name="episodes")
    op.drop_index("ix_episodes_tenant_status", table_name="episodes")
    op.drop_table("episodes")
