"""experiment rows: a dataset row stored once per experiment, not once per item; items
indexed in start order, and counting their runs again after an infrastructure failure.

Expand only (docs/operations.md, "Upgrades"): items keep their `row` column, now nullable.
Items written by earlier releases keep their copy, which this release reads when the
experiment has no `experiment_rows`; items this release creates have none. A later
release moves what is left and drops the column.

Revision ID: a3e8c1d7f905
Revises: f7c3d9a1b2e4
Create Date: 2026-12-11 09:00:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "a3e8c1d7f905"
down_revision: str | None = "f7c3d9a1b2e4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "experiment_rows",
        sa.Column("experiment_id", sa.String(40), nullable=False),
        sa.Column("row_id", sa.String(200), nullable=False),
        sa.Column("row", postgresql.JSONB(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_experiment_rows_experiment_id"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", "row_id", name=op.f("pk_experiment_rows")),
    )
    op.alter_column("experiment_items", "row", existing_type=postgresql.JSONB(), nullable=True)
    # An item run again after an infrastructure failure; older releases never write it.
    op.add_column(
        "experiment_items",
        sa.Column("retries", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    # Pages of an experiment's items in start order (its export, its results) by index.
    op.create_index(
        "ix_experiment_items_experiment_seq", "experiment_items", ["experiment_id", "seq"]
    )


def downgrade() -> None:
    op.drop_index("ix_experiment_items_experiment_seq", table_name="experiment_items")
    op.drop_column("experiment_items", "retries")
    # Every item gets its copy back before the rows go, so the earlier release reads them all.
    op.execute(
        "UPDATE experiment_items AS i SET row = r.row FROM experiment_rows AS r "
        "WHERE i.row IS NULL AND r.experiment_id = i.experiment_id AND r.row_id = i.row_id"
    )
    op.alter_column("experiment_items", "row", existing_type=postgresql.JSONB(), nullable=False)
    op.drop_table("experiment_rows")
