"""Locks and semaphores (docs/wire.md#locks): one call of ``queen.locks_v1`` per batch.

A permit is a KV row (ns ``queen-locks``, key ``<name>#<slot>``) and its token is the row's version;
see ``sql/procedures/085_locks.sql``. Verdicts (held, contended, lost) are results, never errors.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.engine.kv import run_ops
from queen_pg.engine.outcomes import Once


async def apply(
    db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None, once: Once | None = None
) -> dict[str, Any]:
    """Run validated lock ops (queen_pg.api.kv.ops) in order: ``{"results": [...]}``, one per op."""
    return await run_ops(db, calls.LOCKS, calls.LOCKS_ONCE, tenant, ops, now, once)
