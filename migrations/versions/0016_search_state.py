"""search state beside the user's options: issue #25

`Job.search` holds the package and range a stage moved the search to (the --from/--to mix
stage's first culprit); `package`, `good` and `bad` stay as submitted. Before, the mix stage
overwrote them: a --from/--to job whose `package` is set had it from the search, so upgrade
moves those three into `search` and restores what the job was made with (an empty package,
the two environments' names as service/jobs.py names them); downgrade writes them back.
The other JSON columns (`stages`, `result`, ...) are typed in the models only: their SQL
type and stored JSON are unchanged.

Revision ID: 0016
Revises: 0015
Create Date: 2027-01-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

job = sa.table(
    "job",
    sa.column("id", sa.Integer),
    sa.column("package", sa.String),
    sa.column("good", sa.String),
    sa.column("bad", sa.String),
    sa.column("from_env", sa.Text),
    sa.column("from_env_name", sa.String),
    sa.column("to_env_name", sa.String),
    sa.column("search", sa.JSON),
)


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search", sa.JSON(), nullable=True))
    bind = op.get_bind()
    moved = bind.execute(
        sa.select(job.c.id, job.c.package, job.c.good, job.c.bad, job.c.from_env_name,
                  job.c.to_env_name)
        .where(job.c.from_env.is_not(None), job.c.package != "")
    ).all()  # fmt: skip
    for row in moved:
        bind.execute(
            job.update()
            .where(job.c.id == row.id)
            .values(
                search={"package": row.package, "good": row.good, "bad": row.bad},
                package="",
                good=row.from_env_name or "--from",
                bad=row.to_env_name or "--to",
            )
        )


def downgrade() -> None:
    bind = op.get_bind()
    moved = bind.execute(sa.select(job.c.id, job.c.search).where(job.c.search.is_not(None))).all()
    for row in moved:
        found = row.search
        if found is None:  # a JSON null: nothing was moved
            continue
        bind.execute(
            job.update()
            .where(job.c.id == row.id)
            .values(package=found["package"], good=found["good"], bad=found["bad"])
        )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("search")
