"""experiments: evaluation runs, and one item per row x arm x attempt, each run as a task.

Revision ID: 3c8e1f4a9b27
Revises: 5921d5971af0
Create Date: 2026-12-05 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "3c8e1f4a9b27"
down_revision: str | None = "5921d5971af0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("metadata", postgresql.JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
    )
    op.create_index(
        "ix_experiments_tenant_created", "experiments", ["tenant_id", "created_at"], unique=False
    )
    op.create_index(op.f("ix_experiments_status"), "experiments", ["status"], unique=False)
    op.create_table(
        "experiment_items",
        sa.Column("experiment_id", sa.String(40), nullable=False),
        sa.Column("row_id", sa.String(200), nullable=False),
        sa.Column("arm", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("row", postgresql.JSONB(), nullable=False),
        sa.Column("task_id", sa.String(40), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("error_kind", sa.String(16), nullable=True),
        sa.Column("detail", postgresql.JSONB(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_experiment_items_experiment_id"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "experiment_id", "row_id", "arm", "attempt", name=op.f("pk_experiment_items")
        ),
        sa.UniqueConstraint("task_id", name=op.f("uq_experiment_items_task_id")),
    )
    op.create_index(
        "ix_experiment_items_experiment_status",
        "experiment_items",
        ["experiment_id", "status"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_experiment_items_experiment_status", table_name="experiment_items")
    op.drop_table("experiment_items")
    op.drop_index(op.f("ix_experiments_status"), table_name="experiments")
    op.drop_index("ix_experiments_tenant_created", table_name="experiments")
    op.drop_table("experiments")
