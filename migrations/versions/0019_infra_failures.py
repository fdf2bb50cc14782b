"""infrastructure failures: a trial's failures that were the runner's, not the release's

`trial.infra_failures` (JSON, each the runner's `contract.wire.Failure` with the runner and
attempt) and `trial.infra_runner` (the runner of the latest): a trial whose build was
refused, or whose index answered an error, is queued again without using an attempt, on
another runner where one is live, and its job ends naming the cause when it persists
(service/queue.py, infrastructure rules). Trials from before have none.

Revision ID: 0019
Revises: 0018
Create Date: 2027-01-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STRING = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("infra_failures", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("infra_runner", STRING(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.drop_column("infra_runner")
        batch_op.drop_column("infra_failures")
