"""runners authenticated as themselves, idempotent submissions

A runner's registration returns a per-runner secret; the runner row keeps its sha256 only
(`runner.secret_hash`), and every heartbeat, completion, return, lease and leave must present
the secret. Runners registered before this have no secret and must register again.
`job.idempotency` holds sha256(owner, Idempotency-Key) of the submission that created the job,
so a retried POST /jobs returns the first job.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runner", schema=None) as batch_op:
        batch_op.add_column(sa.Column("secret_hash", sa.String(), nullable=True))
        batch_op.create_unique_constraint("uq_runner_secret_hash", ["secret_hash"])
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency", sa.String(), nullable=True))
        batch_op.create_unique_constraint("uq_job_idempotency", ["idempotency"])


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_constraint("uq_job_idempotency", type_="unique")
        batch_op.drop_column("idempotency")
    with op.batch_alter_table("runner", schema=None) as batch_op:
        batch_op.drop_constraint("uq_runner_secret_hash", type_="unique")
        batch_op.drop_column("secret_hash")
