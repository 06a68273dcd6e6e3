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


async def run_ops(
    db: Database,
    sql: str,
    once_sql: str,
    tenant: str,
    ops: list[dict[str, Any]],
    now: datetime | None,
    once: Once | None,
) -> dict[str, Any]:
    """One call of a jsonb-ops procedure (kv_v1 / locks_v1), or of its outcome-window wrapper (_v2)
    when the request carries a key: a retry then answers the recorded result."""
    if once is None:
        raw = await db.fetchval(sql, tenant, orjson.dumps(ops).decode(), now)
    else:
        rows = await db.fetch(once_sql, tenant, orjson.dumps(ops).decode(), now, *once.args())
        raw, once.replayed = rows[0]["result"], rows[0]["replayed"]
    result: dict[str, Any] = orjson.loads(raw)
    return result


async def apply(
    db: Database, tenant: str, ops: list[dict[str, Any]], now: datetime | None = None, once: Once | None = None
) -> dict[str, Any]:
    """Apply validated ops (queen_pg.api.kv_ops) in order: ``{"results": [...]}``, one per op."""
    return await run_ops(db, KV_SQL, KV_ONCE_SQL, tenant, ops, now, once)


NAMESPACES_SQL = "SELECT ns FROM queen.kv_namespaces_v1($1, $2, $3)"


async def namespaces(db: Database, tenant: str, after: str | None, limit: int) -> dict[str, Any]:
    """A keyset page of the tenant's KV namespaces (ascending); ``nextAfter`` when truncated."""
    rows = await db.fetch(NAMESPACES_SQL, tenant, after, limit + 1)
    names = [r["ns"] for r in rows[:limit]]
    truncated = len(rows) > limit
    return {"namespaces": names, "truncated": truncated, "nextAfter": names[-1] if truncated else None}


KEYS_SQL = "SELECT queen.kv_keys_v1($1, $2, $3, $4, $5, $6, $7)"


async def keys(
    db: Database,
    tenant: str,
    ns: str,
    prefix: str,
    after: str | None,
    limit: int,
    keys_only: bool,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A keyset page of a namespace's live keys starting with ``prefix`` (``""``: all), as getPrefix."""
    page: dict[str, Any] = orjson.loads(await db.fetchval(KEYS_SQL, tenant, ns, prefix, after, limit, keys_only, now))
    return page
