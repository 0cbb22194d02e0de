"""idempotency_fingerprint: what a keyed task was submitted with, to tell a retry from a reused key.

Nullable: rows stored before it have none, and a repeat of their key is answered as a retry.

Revision ID: 5921d5971af0
Revises: 7b3e9d41c0a5
Create Date: 2026-12-04 10:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5921d5971af0"
down_revision: str | None = "7b3e9d41c0a5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("idempotency_fingerprint", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "idempotency_fingerprint")
