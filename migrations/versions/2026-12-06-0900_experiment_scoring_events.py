"""experiment scoring and events: a lease for scoring outside the advancing transaction,
earlier gradings kept on each item, and an experiment's own gapless event log.

Revision ID: 8d2b6e0f3a51
Revises: 3c8e1f4a9b27
Create Date: 2026-12-06 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "8d2b6e0f3a51"
down_revision: str | None = "3c8e1f4a9b27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "experiment_items",
        sa.Column("scoring_until", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "experiment_items",
        sa.Column("scoring_claims", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "experiment_items",
        sa.Column(
            "gradings",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )
    op.add_column(
        "experiments",
        sa.Column("event_seq", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "experiment_events",
        sa.Column("experiment_id", sa.String(40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", postgresql.JSONB(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_experiment_events_experiment_id"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", "seq", name=op.f("pk_experiment_events")),
    )


def downgrade() -> None:
    op.drop_table("experiment_events")
    op.drop_column("experiments", "event_seq")
    op.drop_column("experiment_items", "gradings")
    op.drop_column("experiment_items", "scoring_claims")
    op.drop_column("experiment_items", "scoring_until")
