"""webhook rotation overlap: the secret a rotation replaced, still signing until a time.

Revision ID: b9d4e2f6a1c3
Revises: a3e8c1d7f905
Create Date: 2026-12-12 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b9d4e2f6a1c3"
down_revision: str | None = "a3e8c1d7f905"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding them rewrites nothing, and older releases never read them
    # (a delivery they send is signed with the current secret alone, as before).
    op.add_column(
        "webhook_subscriptions", sa.Column("previous_secret", sa.String(100), nullable=True)
    )
    op.add_column(
        "webhook_subscriptions",
        sa.Column("previous_until", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("webhook_subscriptions", "previous_until")
    op.drop_column("webhook_subscriptions", "previous_secret")
