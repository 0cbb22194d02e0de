"""step capture: token ids, logprobs and request messages of a captured model call (RL).

Revision ID: e5f1a2b3c4d6
Revises: d9b1f6a3e872
Create Date: 2026-12-09 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e5f1a2b3c4d6"
down_revision: str | None = "d9b1f6a3e872"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and older releases never write it.
    op.add_column("steps", sa.Column("capture", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("steps", "capture")
