"""task forks: each step's message, a fork's parent, where its replay diverged, step snapshots.

A fork by replay plays a task's recorded assistant messages again; the step rows kept
their parts (text, the tool call) but not the message itself, whose keys, call ids and
argument strings a rebuilt one would not reproduce byte for byte. `json`, not `jsonb`, so
its keys come back in the order sent.

Revision ID: c5f9a3b7e1d2
Revises: b4e8f2a6d9c3
Create Date: 2026-12-19 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "c5f9a3b7e1d2"
down_revision: str | None = "b4e8f2a6d9c3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding them rewrites nothing; an earlier release ignores them.
    op.add_column("steps", sa.Column("message", sa.JSON(), nullable=True))
    op.add_column("tasks", sa.Column("diverged", postgresql.JSONB(), nullable=True))
    op.add_column("tasks", sa.Column("parent_id", sa.String(length=40), nullable=True))
    op.create_index("ix_tasks_parent_id", "tasks", ["parent_id"])
    op.create_table(
        "step_snapshots",
        sa.Column(
            "task_id",
            sa.String(length=40),
            sa.ForeignKey("tasks.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("archive", sa.LargeBinary(), nullable=True),
        sa.Column("same_as", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("step_snapshots")
    op.drop_index("ix_tasks_parent_id", table_name="tasks")
    op.drop_column("tasks", "parent_id")
    op.drop_column("tasks", "diverged")
    op.drop_column("steps", "message")
