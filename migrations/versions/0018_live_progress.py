"""live progress: what a running trial's status line shows, from its runner's heartbeat

`trial.steps` (the steps its step markers span so far), `trial.floor_first` and `trial.floor`
(the floor of its first and latest complete step, bytes), beside `trial.rss`: the heartbeat
sends them (contract/wire.py `Heartbeat`), `GET /jobs/{id}` shows them for each running
trial. Trials from before, and runners that do not send them, have none.

Revision ID: 0018
Revises: 0017
Create Date: 2027-01-14
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("steps", "floor_first", "floor")


def upgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
