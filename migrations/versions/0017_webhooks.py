"""webhooks: a job's --webhook URL, the site it was submitted through, and the deliveries

`job.webhook_url` is the option (service/options.py); `job.site_url` the base of the links a
webhook carries when BISECT_PUBLIC_URL is unset. `webhook_delivery` holds one row per webhook
a job's end sends, with its attempts (service/webhooks.py). Jobs from before have neither.

Revision ID: 0017
Revises: 0016
Create Date: 2027-01-12
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sqlmodel.sql.sqltypes.UTCDateTime
STRING = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("status", STRING(), nullable=False),
        sa.Column("created_at", UTC_DATETIME(), nullable=False),
        sa.Column("next_at", UTC_DATETIME(), nullable=True),
        sa.Column("claim", STRING(), nullable=True),
        sa.Column("claimed_until", UTC_DATETIME(), nullable=True),
        sa.Column("attempts", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("webhook_delivery", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhook_delivery_job_id"), ["job_id"], unique=False)
        batch_op.create_index(
            "ix_webhook_delivery_status_next_at", ["status", "next_at"], unique=False
        )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_url", STRING(length=2000), nullable=True))
        batch_op.add_column(sa.Column("site_url", STRING(length=2000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("site_url")
        batch_op.drop_column("webhook_url")
    with op.batch_alter_table("webhook_delivery", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_delivery_status_next_at")
        batch_op.drop_index(batch_op.f("ix_webhook_delivery_job_id"))
    op.drop_table("webhook_delivery")
