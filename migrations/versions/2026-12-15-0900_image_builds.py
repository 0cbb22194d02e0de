"""image_builds: tenants' own sandbox images built from a Dockerfile (/v1/images/builds).

Revision ID: e5c9a1f3b7d2
Revises: d8e3b5a7c2f4
Create Date: 2026-12-15 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e5c9a1f3b7d2"
down_revision: str | None = "d8e3b5a7c2f4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # One new table: nothing an older release reads changes.
    op.create_table(
        "image_builds",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("base", sa.String(64), nullable=False),
        sa.Column("reference", sa.String(200), nullable=False),
        sa.Column("dockerfile", sa.Text(), nullable=False),
        sa.Column("context", sa.LargeBinary(), nullable=True),
        sa.Column("build_args", postgresql.JSONB(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("image_config", postgresql.JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("log", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("created_at", _TZ, nullable=False),
        sa.Column("built_at", _TZ, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("image_builds")
