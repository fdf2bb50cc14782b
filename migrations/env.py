"""Alembic environment built from the SQLModel metadata."""

from alembic import context
from sqlalchemy import engine_from_config, pool, text
from sqlmodel import SQLModel

import service.models  # noqa: F401  (registers the tables on the metadata)
from service.db import MIGRATION_LOCK

config = context.config
target_metadata = SQLModel.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        # Batch mode lets later migrations alter SQLite tables the same way as Postgres ones.
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # One migrator at a time (service/db.py `upgrade`): the others wait here,
                # then read the revision this one wrote and have nothing to do.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": MIGRATION_LOCK})  # fmt: skip
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
