"""Locks and semaphores (WIRE.md §2.7): one call of ``queen.locks_v1`` per batch.

A permit is a KV row (ns ``queen-locks``, key ``<name>#<slot>``) and its token is the row's version;
see ``sql/procedures/085_locks.sql``. Verdicts (held, contended, lost) are results, never errors.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine.outcomes import Once

LOCKS_SQL = "SELECT queen.locks_v1($1, $2::text::jsonb, $3)"
LOCKS_ONCE_SQL = "SELECT * FROM queen.locks_v2($1, $2::text::jsonb, $3, $4, $5, $6, $7)"


async def apply(
    db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None, once: Once | None = None
) -> dict[str, Any]:
    """Run validated lock ops (queen_pg.api.kv_ops) in order: ``{"results": [...]}``, one per op."""
    if once is None:
        raw = await db.fetchval(LOCKS_SQL, tenant, orjson.dumps(ops).decode(), now)
    else:  # the outcome window (queen_pg/engine/outcomes.py): a retry answers the recorded result
        rows = await db.fetch(LOCKS_ONCE_SQL, tenant, orjson.dumps(ops).decode(), now, *once.args())
        raw, once.replayed = rows[0]["result"], rows[0]["replayed"]
    result: dict[str, Any] = orjson.loads(raw)
    return result
