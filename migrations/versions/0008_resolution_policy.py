"""resolution policy: the pins are resolved as of an instant (engine/resolution.py)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Jobs from before the policy resolved against the index of their day: as of None.
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("resolve_at", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True)
        )
        batch_op.add_column(
            sa.Column("pins_as_of", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("pins_as_of")
        batch_op.drop_column("resolve_at")
