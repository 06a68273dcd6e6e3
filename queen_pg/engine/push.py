"""Push: pack items into one segment per (queue, partition), one call to ``queen.push_v1``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from queen_pg.db.pool import Database
from queen_pg.engine import codec

PUSH_SQL = "SELECT * FROM queen.push_v1($1, $2, $3, $4, $5, $6, $7)"


@dataclass(frozen=True, slots=True)
class NewMessage:
    queue: str
    partition: str
    payload: bytes  # the payload as JSON text
    transaction_id: str | None
    trace_id: uuid.UUID | None


async def push(db: Database, tenant: str, items: list[NewMessage]) -> list[dict[str, Any]]:
    """Append ``items``; one result per item, in order (WIRE.md §2.1)."""
    groups: dict[tuple[str, str], int] = {}
    frames: list[list[bytes]] = []
    item_group: list[int] = []
    hashes: list[uuid.UUID] = []
    msgids: list[uuid.UUID] = []
    txns: list[str] = []
    for item in items:
        key = (item.queue, item.partition)
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(groups)
            frames.append([])
        mid = codec.uuid7()
        txn = item.transaction_id or str(mid)
        frames[g].append(codec.encode_frame(mid, txn, item.payload, item.trace_id))
        item_group.append(g + 1)
        hashes.append(codec.txn_hash(txn))
        msgids.append(mid)
        txns.append(txn)
    rows = await db.fetch(
        PUSH_SQL,
        tenant,
        [k[0] for k in groups],
        [k[1] for k in groups],
        [codec.pack(f) for f in frames],
        item_group,
        hashes,
        msgids,
    )
    out: list[dict[str, Any]] = []
    for row, item, txn in zip(rows, items, txns, strict=True):
        out.append(
            {
                "index": row["idx"] - 1,
                "status": row["status"],
                "transactionId": txn,
                "messageId": str(row["message_id"]),
                "queue": item.queue,
                "partition": item.partition,
                "partitionId": str(row["partition_id"]),
                "offset": row["msg_offset"],
                "error": None,
            }
        )
    return out
