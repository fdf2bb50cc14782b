"""trial numbers: each job counts its own trials 1, 2, ... (the number users see)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("number", sa.Integer(), nullable=False, server_default="0"))
    # Existing trials are numbered in the order they were queued, as new ones are.
    op.execute(
        "UPDATE trial SET number = (SELECT COUNT(*) FROM trial AS earlier "
        "WHERE earlier.job_id = trial.job_id AND earlier.id <= trial.id)"
    )
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.alter_column("number", server_default=None)
        batch_op.create_unique_constraint("uq_trial_job_number", ["job_id", "number"])


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.drop_constraint("uq_trial_job_number", type_="unique")
        batch_op.drop_column("number")
