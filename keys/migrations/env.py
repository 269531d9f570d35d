"""Alembic environment: runs against the engine handed in by wmark.keys.db (no alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from wmark.keys.db_timeouts import unbounded
from wmark.keys.models import Base

_LOCK_ID = 0x776D61726B  # "wmark": serialises concurrent migrations on PostgreSQL


def run_migrations_online() -> None:
    engine = context.config.attributes["engine"]
    with engine.connect() as connection, unbounded(connection):  # a migration may rightly run long
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _LOCK_ID})
            connection.commit()
        try:
            context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _LOCK_ID})
                connection.commit()


run_migrations_online()
