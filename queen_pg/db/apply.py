"""Apply ``sql/schema.sql`` and ``sql/procedures/*.sql`` at boot.

All files run in lexical order inside one transaction holding the transaction-scoped advisory lock
``APPLY_LOCK``, so replicas booting together apply one after another and each apply is a no-op
for the ones that follow (every statement is idempotent).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import asyncpg

from queen_pg.db.locks import APPLY_LOCK
from queen_pg.resources import data_dir

log = logging.getLogger("queen_pg.db")


def sql_dir() -> Path:
    """The ``sql/`` directory: ``queen_pg/sql`` in a wheel, the repository's ``sql/`` in a checkout."""
    return data_dir("sql", "schema.sql")


def sql_files(root: Path | None = None) -> list[Path]:
    """schema.sql first, then procedures/*.sql in lexical order."""
    root = root or sql_dir()
    return [root / "schema.sql", *sorted((root / "procedures").glob("*.sql"))]


def sql_text(root: Path | None = None) -> str:
    return "\n".join(f"-- file: {p.name}\n" + p.read_text() for p in sql_files(root))


async def apply_sql(conn: asyncpg.Connection, root: Path | None = None, attempts: int = 5) -> None:
    started = time.monotonic()
    files = sql_files(root)
    for attempt in range(1, attempts + 1):
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", APPLY_LOCK)
                for path in files:
                    await conn.execute(path.read_text())
            break
        except asyncpg.DeadlockDetectedError:
            # other replicas' jobs hold table locks the DDL re-takes: the apply rolled back whole and is
            # idempotent, so it runs again
            if attempt == attempts:
                raise
            log.warning("event=schema_apply_deadlock attempt=%d", attempt)
    log.info("event=schema_applied files=%d ms=%.0f", len(files), (time.monotonic() - started) * 1000)
