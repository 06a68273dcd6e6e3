"""Locks and semaphores (WIRE.md §2.7): one call of ``queen.locks_v1`` per batch.

A permit is a KV row (ns ``queen-locks``, key ``<name>#<slot>``) and its token is the row's version;
see ``sql/procedures/085_locks.sql``. Verdicts (held, contended, lost) are results, never errors.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database

LOCKS_SQL = "SELECT queen.locks_v1($1, $2::text::jsonb, $3)"


async def apply(db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None) -> dict[str, Any]:
    """Run validated lock ops (queen_pg.api.kv_ops) in order: ``{"results": [...]}``, one per op."""
    raw = await db.fetchval(LOCKS_SQL, tenant, orjson.dumps(ops).decode(), now)
    result: dict[str, Any] = orjson.loads(raw)
    return result
