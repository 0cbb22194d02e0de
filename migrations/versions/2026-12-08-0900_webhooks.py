"""webhooks: subscriptions, an outbox written with each state change, deliveries
(each row one event for one subscription, with its attempt log).

Revision ID: d9b1f6a3e872
Revises: c4a7e2b91d05
Create Date: 2026-12-08 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d9b1f6a3e872"
down_revision: str | None = "c4a7e2b91d05"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", postgresql.JSONB(), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_at", _TZ, nullable=False),
        sa.Column("rotated_at", _TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_subscriptions")),
    )
    op.create_index(
        op.f("ix_webhook_subscriptions_tenant_id"), "webhook_subscriptions", ["tenant_id"]
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("event_id", sa.String(40), nullable=False),
        sa.Column("event_type", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("subscription_id", sa.String(40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("task_id", sa.String(40), nullable=True),
        sa.Column("experiment_id", sa.String(40), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("log", postgresql.JSONB(), nullable=False),
        sa.Column("next_attempt_at", _TZ, nullable=False),
        sa.Column("lease_until", _TZ, nullable=True),
        sa.Column("created_at", _TZ, nullable=False),
        sa.Column("delivered_at", _TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    for column in ("event_id", "subscription_id", "task_id", "experiment_id"):
        op.create_index(op.f(f"ix_webhook_deliveries_{column}"), "webhook_deliveries", [column])
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"]
    )


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_subscriptions")
