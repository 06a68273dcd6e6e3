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

KV_SQL = "SELECT queen.kv_v1($1, $2::text::jsonb, $3)"


async def apply(db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None) -> dict[str, Any]:
    """Apply validated ops (queen_pg.api.kv_ops) in order: ``{"results": [...]}``, one per op."""
    raw = await db.fetchval(KV_SQL, tenant, orjson.dumps(ops).decode(), now)
    result: dict[str, Any] = orjson.loads(raw)
    return result
