"""pooled evidence: a candidate's runs judged together (engine/pooled.py), longer-run hints

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Candidates judged before pooling keep None: their verdict was the vote alone.
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pooled", sa.JSON(), nullable=True))
    # Trials queued before longer runs had no hints: an empty mapping.
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hints", sa.JSON(), nullable=True))
    op.execute("UPDATE trial SET hints = '{}'")


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.drop_column("hints")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("pooled")
