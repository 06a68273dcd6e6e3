"""Queue management: configure and delete, one procedure call each."""

from __future__ import annotations

from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls


async def configure(
    db: Database,
    tenant: str,
    queue: str,
    namespace: str | None,
    task: str | None,
    options: dict[str, Any],
    *,
    may_weaken: bool,
) -> dict[str, Any]:
    """The queue as configured. ``may_weaken`` false: options that weaken an existing queue's guarantees
    (encryption off, a shorter dedup window) are refused, 403 ``forbidden``, decided by the procedure
    under the queue row lock."""
    raw = await db.fetchval(
        calls.CONFIGURE_QUEUE,
        tenant,
        queue,
        namespace,
        task,
        orjson.dumps(options).decode(),
        may_weaken,
    )
    result: dict[str, Any] = orjson.loads(raw)
    return result


async def delete(db: Database, tenant: str, queue: str) -> bool:
    return bool(await db.fetchval(calls.DELETE_QUEUE, tenant, queue))
