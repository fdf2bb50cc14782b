"""stages: --from/--to mixes, culprit releases, attribution and commits (issue #12)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_COLUMNS = (
    ("from_env_name", sqlmodel.sql.sqltypes.AutoString(length=200)),
    ("from_env", sa.Text()),
    ("to_env_name", sqlmodel.sql.sqltypes.AutoString(length=200)),
    ("to_env", sa.Text()),
    ("repo", sqlmodel.sql.sqltypes.AutoString(length=2000)),
    ("dependency", sa.JSON()),
    ("attribution", sa.JSON()),
    ("commit", sa.JSON()),
)


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name, type_ in JOB_COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
        # Jobs made before this revision never asked for attribution or commits.
        batch_op.add_column(
            sa.Column("attribute", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(
            sa.Column("commits", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("stages", sa.JSON(), nullable=True))
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False, server_default=""
            )
        )
        batch_op.add_column(sa.Column("pins", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("applied", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("source", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("subject", sa.Text(), nullable=True))
        batch_op.create_index("ix_candidate_stage", ["stage"], unique=False)
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("trace", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column("profile", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("commits", sa.JSON(), nullable=True))
    # Rows from before hold the empty lists the models start with.
    op.execute("UPDATE job SET stages = '[]'")
    op.execute("UPDATE candidate SET pins = '[]', applied = '[]'")


def downgrade() -> None:
    with op.batch_alter_table("trial", schema=None) as batch_op:
        batch_op.drop_column("commits")
        batch_op.drop_column("profile")
        batch_op.drop_column("trace")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_index("ix_candidate_stage")
        for name in ("subject", "source", "applied", "pins", "stage"):
            batch_op.drop_column(name)
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name in ("stages", "commits", "attribute", *(n for n, _ in reversed(JOB_COLUMNS))):
            batch_op.drop_column(name)
