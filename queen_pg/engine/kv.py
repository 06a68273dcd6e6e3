"""KV (WIRE.md §2.6): one call of ``queen.kv_v1`` per batch.

A ``required`` op that lost its condition raises :class:`~queen_pg.errors.Verdict`
(``kv_precondition``, with ``failedIndex``, ``kvReason``, ``version``, ``value``): nothing of the batch
was written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine.outcomes import Once

KV_SQL = "SELECT queen.kv_v1($1, $2::text::jsonb, $3)"
KV_ONCE_SQL = "SELECT * FROM queen.kv_v2($1, $2::text::jsonb, $3, $4, $5, $6, $7)"


async def apply(
    db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None, once: Once | None = None
) -> dict[str, Any]:
    """Apply validated ops (queen_pg.api.kv_ops) in order: ``{"results": [...]}``, one per op."""
    if once is None:
        raw = await db.fetchval(KV_SQL, tenant, orjson.dumps(ops).decode(), now)
    else:  # the outcome window (queen_pg/engine/outcomes.py): a retry answers the recorded result
        rows = await db.fetch(KV_ONCE_SQL, tenant, orjson.dumps(ops).decode(), now, *once.args())
        raw, once.replayed = rows[0]["result"], rows[0]["replayed"]
    result: dict[str, Any] = orjson.loads(raw)
    return result
