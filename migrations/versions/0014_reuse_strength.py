"""reuse strength: issue #23

A candidate whose verdict another job of the same reuse key and owner contradicted names
that job (service/reuse.py rule 6). Rows from before have no contradiction recorded; their
reuse keys (KEY_VERSION 1) no longer match any new one, so none of them is reused.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("contradicted_by_job", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("contradicted_by_job")
