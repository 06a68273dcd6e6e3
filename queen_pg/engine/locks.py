"""Locks and semaphores (docs/wire.md#locks): one call of ``queen.locks_v1`` per batch.

A permit is a KV row (ns ``queen-locks``, key ``<name>#<slot>``) and its token is the row's version;
see ``sql/procedures/085_locks.sql``. Verdicts (held, contended, lost) are results, never errors.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queen_pg.db.pool import Database
from queen_pg.engine.kv import run_ops
from queen_pg.engine.outcomes import Once

LOCKS_SQL = "SELECT queen.locks_v1($1, $2::text::jsonb, $3)"
LOCKS_ONCE_SQL = "SELECT * FROM queen.locks_v2($1, $2::text::jsonb, $3, $4, $5, $6, $7)"


async def apply(
    db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None, once: Once | None = None
) -> dict[str, Any]:
    """Run validated lock ops (queen_pg.api.kv.ops) in order: ``{"results": [...]}``, one per op."""
    return await run_ops(db, LOCKS_SQL, LOCKS_ONCE_SQL, tenant, ops, now, once)
