"""interrupted_steps: why a step ended before its tool answered (cancel, timeout, model error).

Revision ID: 7b3e9d41c0a5
Revises: 4f8a1c6d2e93
Create Date: 2026-12-04 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7b3e9d41c0a5"
down_revision: str | None = "4f8a1c6d2e93"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("interrupted", sa.String(32), nullable=True))


def downgrade() -> None:
    op.drop_column("steps", "interrupted")
