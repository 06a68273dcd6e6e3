"""Alembic environment of queen-pg: online mode only.

The database URL comes from ``-x url=...``, else from the caller (``queen_pg.migrate`` puts it in
``config.attributes["database_url"]``), else from ``$DATABASE_URL``. Any ``postgresql://`` URL works,
including ``postgresql://user@/db?host=/socket/dir&port=N``; it is run through psycopg 3.

All revisions of one ``upgrade`` run in one transaction that first takes the advisory lock
APPLY_LOCK, the lock boot takes to apply ``sql/`` (queen_pg/db/apply.py): a migration and a booting
replica never apply schema at the same time. Alembic's ``alembic_version`` table is kept in ``public``
(explicitly: see queen_pg.migrate.VERSION_TABLE_SCHEMA).
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from alembic.util import CommandError
from sqlalchemy import create_engine, pool, text

from queen_pg.db.locks import APPLY_LOCK
from queen_pg.migrate import VERSION_TABLE_SCHEMA, sqlalchemy_url

config = context.config

# The alembic command line configures logging from alembic.ini; queen_pg.migrate does not.
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# No SQLAlchemy models: revisions are SQL (see versions/0001_baseline.py); no autogenerate.
target_metadata = None


def database_url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.attributes.get("database_url")
        or os.environ.get("DATABASE_URL")
    )
    if not url:
        raise CommandError("no database URL: pass `-x url=postgresql://user@host/dbname` or set DATABASE_URL")
    try:
        sqlalchemy_url(url)
    except Exception as exc:  # ValueError or SQLAlchemy's ArgumentError: one line, no traceback
        raise CommandError(f"bad database URL: {exc}") from exc
    return str(url)


def run_migrations_offline() -> None:
    raise CommandError(
        "offline (--sql) mode is not supported: revisions execute sql/ through the psycopg "
        "connection; run online with -x url=... or DATABASE_URL"
    )


def run_migrations_online() -> None:
    engine = create_engine(sqlalchemy_url(database_url()), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                version_table_schema=VERSION_TABLE_SCHEMA,
                on_version_apply=config.attributes.get("on_version_apply"),
            )
            with context.begin_transaction():
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": APPLY_LOCK})
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
