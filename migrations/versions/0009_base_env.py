"""base environment: the user's own environment file, held as the job's pins (engine/baseenv.py)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Jobs from before had no base environment: None.
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("base_env_name", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True)
        )
        batch_op.add_column(sa.Column("base_env", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("base_env")
        batch_op.drop_column("base_env_name")
