"""pins resolved on runners (resolve trials, the job's pin state) and job owners

The API server no longer resolves the good bound's pins itself (resolution may build
sdists, i.e. run code the job names): a job with pending pins gets a resolve trial first
(service/pins.py). Jobs stored before this were resolved at submission: their state is
"resolved" when they hold pins, else "none".

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("pin_state", sa.String(), nullable=False, server_default="none")
        )
        batch_op.add_column(sa.Column("pin_key", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_job_pin_key"), ["pin_key"], unique=False)
        batch_op.add_column(sa.Column("owner", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_job_owner"), ["owner"], unique=False)
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(), nullable=False, server_default="run"))
    op.execute(
        "UPDATE job SET pin_state = 'resolved' WHERE constraints IS NOT NULL "
        "AND CAST(constraints AS TEXT) NOT IN ('[]', 'null')"
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.alter_column("pin_state", server_default=None)
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.alter_column("kind", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.drop_column("kind")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_owner"))
        batch_op.drop_column("owner")
        batch_op.drop_index(batch_op.f("ix_job_pin_key"))
        batch_op.drop_column("pin_key")
        batch_op.drop_column("pin_state")
