"""KV (docs/wire.md#kv): one call of ``queen.kv_v3`` per batch (the outcome window and the answer budget).

A ``required`` op that lost its condition raises :class:`~queen_pg.errors.Verdict`
(``kv_precondition``, with ``failedIndex``, ``kvReason``, ``version``, ``value``): nothing of the batch
was written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.engine.outcomes import Once


async def run_ops(
    db: Database,
    sql: str,
    once_sql: str,
    tenant: str,
    ops: list[dict[str, Any]],
    now: datetime | None,
    once: Once | None,
) -> dict[str, Any]:
    """One call of a jsonb-ops procedure (locks_v1), or of its outcome-window wrapper (locks_v2) when
    the request carries a key: a retry then answers the recorded result."""
    if once is None:
        raw = await db.fetchval(sql, tenant, orjson.dumps(ops).decode(), now)
    else:
        rows = await db.fetch(once_sql, tenant, orjson.dumps(ops).decode(), now, *once.args())
        raw, once.replayed = rows[0]["result"], rows[0]["replayed"]
    result: dict[str, Any] = orjson.loads(raw)
    return result


async def apply(
    db: Database,
    tenant: str,
    ops: list[dict[str, Any]],
    now: datetime | None = None,
    once: Once | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Apply validated ops (queen_pg.api.kv.ops) in order: ``{"results": [...]}``, one per op.

    ``max_bytes`` is the answer budget (queen_pg/engine/answers.py; None = none): a getPrefix page stops
    at what the ops before it left, and a batch whose answer passes it is 413 ``answer_too_large``
    (nothing applied)."""
    keyed = once.args() if once is not None else (None, "kv", None, 60)
    rows = await db.fetch(calls.KV, tenant, orjson.dumps(ops).decode(), now, max_bytes, *keyed)
    if once is not None:
        once.replayed = rows[0]["replayed"]
    result: dict[str, Any] = orjson.loads(rows[0]["result"])
    return result


async def namespaces(db: Database, tenant: str, after: str | None, limit: int) -> dict[str, Any]:
    """A keyset page of the tenant's KV namespaces (ascending); ``nextAfter`` when truncated."""
    rows = await db.fetch(calls.KV_NAMESPACES, tenant, after, limit + 1)
    names = [r["ns"] for r in rows[:limit]]
    truncated = len(rows) > limit
    return {"namespaces": names, "truncated": truncated, "nextAfter": names[-1] if truncated else None}


async def keys(
    db: Database,
    tenant: str,
    ns: str,
    prefix: str,
    after: str | None,
    limit: int,
    keys_only: bool,
    now: datetime | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """A keyset page of a namespace's live keys starting with ``prefix`` (``""``: all), as getPrefix;
    it stops early (``truncated``, ``nextAfter``) at ``max_bytes``, the answer budget (None = none)."""
    raw = await db.fetchval(calls.KV_KEYS, tenant, ns, prefix, after, limit, keys_only, now, max_bytes)
    page: dict[str, Any] = orjson.loads(raw)
    return page
