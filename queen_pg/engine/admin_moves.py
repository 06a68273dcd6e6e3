"""The two 0.x admin calls (docs/wire.md#legacy-admin): dead-letter one message now, clear a queue; one procedure call
each (``sql/procedures/075_admin_clear.sql``). Refusals come back as results and are raised here:
404 ``not_found`` (no partition, group, message or queue), 409 ``conflict`` (the group already settled
the message)."""

from __future__ import annotations

from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls, codec
from queen_pg.engine.pop import QUEUE_MODE, group_label, not_found
from queen_pg.errors import CONFLICT, NOT_FOUND, QueenError

DEFAULT_ERROR = "moved to the dead-letter queue by an operator"


async def move_to_dlq(
    db: Database, tenant: str, partition_id: int, transaction_id: str, group: str | None, error: str | None
) -> dict[str, Any]:
    """Dead-letter the message for one group (None: queue mode); see ``queen.message_dlq_v1``."""
    grp = group or QUEUE_MODE
    txn = codec.txn_hash(transaction_id)
    raw = await db.fetchval(calls.MESSAGE_DLQ, tenant, partition_id, txn, transaction_id, grp, error or DEFAULT_ERROR)
    res: dict[str, Any] = orjson.loads(raw)
    status = res["status"]
    if status == "no_partition":
        raise QueenError(NOT_FOUND, detail=f"partition {partition_id} not found")
    if status == "no_group":
        raise QueenError(NOT_FOUND, detail=f"{group_label(grp)} has no cursor on partition {partition_id}")
    if status == "no_message":
        raise QueenError(NOT_FOUND, detail=f"no message {transaction_id!r} in partition {partition_id}")
    if status in ("already_dead", "already_consumed"):
        done = "dead-lettered" if status == "already_dead" else "completed"
        raise QueenError(
            CONFLICT, detail=f"{group_label(grp)} already {done} message {transaction_id!r} (offset {res['offset']})"
        )
    return {"success": True, "transactionId": transaction_id, **res}


async def clear_queue(db: Database, tenant: str, queue: str, partition: str | None) -> dict[str, Any]:
    """Drop every message of the queue (or one partition), keep the queue; see ``queen.queue_clear_v1``."""
    res: dict[str, Any] = orjson.loads(await db.fetchval(calls.QUEUE_CLEAR, tenant, queue, partition))
    if res["status"] in ("no_queue", "no_partition"):
        raise not_found(res["status"], queue, partition)
    return {"success": True, **res}
