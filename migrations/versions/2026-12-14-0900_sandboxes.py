"""sandboxes: sandboxes callers drive themselves (/v1/sandboxes) and their command log.

Revision ID: d8e3b5a7c2f4
Revises: c4f7a2d9e8b1
Create Date: 2026-12-14 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d8e3b5a7c2f4"
down_revision: str | None = "c4f7a2d9e8b1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Two new tables: nothing an older release reads changes.
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("metadata", postgresql.JSONB(), nullable=False),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("commands", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", _TZ, nullable=False),
        sa.Column("expires_at", _TZ, nullable=False),
        sa.Column("ended_at", _TZ, nullable=True),
    )
    op.create_index("ix_sandboxes_tenant_created", "sandboxes", ["tenant_id", "created_at"])
    op.create_index(
        "ix_sandboxes_active",
        "sandboxes",
        ["worker"],
        postgresql_where=sa.text("status IN ('starting', 'running')"),
    )
    op.create_table(
        "sandbox_commands",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "sandbox_id",
            sa.String(40),
            sa.ForeignKey("sandboxes.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("argv", postgresql.JSONB(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("user", sa.String(64), nullable=True),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("timed_out", sa.Boolean(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("started_at", _TZ, nullable=False),
    )
    op.create_index(
        "ix_sandbox_commands_sandbox_seq", "sandbox_commands", ["sandbox_id", "seq"], unique=True
    )


def downgrade() -> None:
    op.drop_table("sandbox_commands")
    op.drop_table("sandboxes")
