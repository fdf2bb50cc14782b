"""job options as columns: one definition for JobCreate and Job

Job now extends service.options.JobOptions, so every option is a column of its own with the
request's field name: `memory_limit_bytes` becomes `memory_limit`, the classifier overrides
(`classifier` JSON) become `min_growth_mib` and `min_growth_fraction`, and the job's own
environment variables (`variables`) are new. Option lists are NOT NULL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

job = sa.table(
    "job",
    sa.column("id", sa.Integer),
    sa.column("classifier", sa.JSON),
    sa.column("min_growth_mib", sa.Float),
    sa.column("min_growth_fraction", sa.Float),
)


LISTS = ("requirements", "extra_index_urls", "find_links")


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.alter_column("memory_limit_bytes", new_column_name="memory_limit")
        batch_op.add_column(sa.Column("min_growth_mib", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("min_growth_fraction", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("variables", sa.JSON(), nullable=True))
    conn = op.get_bind()
    for row in conn.execute(sa.select(job.c.id, job.c.classifier)).all():
        settings = row.classifier or {}
        conn.execute(
            job.update()
            .where(job.c.id == row.id)
            .values(
                min_growth_mib=settings.get("min_growth_mib"),
                min_growth_fraction=settings.get("min_growth_fraction"),
            )
        )
    op.execute("UPDATE job SET variables = '{}' WHERE variables IS NULL")
    for name in LISTS:
        op.execute(f"UPDATE job SET {name} = '[]' WHERE {name} IS NULL")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("classifier")
        # Options are never NULL: an empty list or mapping says "none".
        for name in (*LISTS, "variables"):
            batch_op.alter_column(name, existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("classifier", sa.JSON(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(job.c.id, job.c.min_growth_mib, job.c.min_growth_fraction)
    ).all()
    for row in rows:
        settings = {
            k: v
            for k, v in (("min_growth_mib", row[1]), ("min_growth_fraction", row[2]))
            if v is not None
        }
        conn.execute(job.update().where(job.c.id == row.id).values(classifier=settings))
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name in LISTS:
            batch_op.alter_column(name, existing_type=sa.JSON(), nullable=True)
        batch_op.drop_column("variables")
        batch_op.drop_column("min_growth_fraction")
        batch_op.drop_column("min_growth_mib")
        batch_op.alter_column("memory_limit", new_column_name="memory_limit_bytes")
