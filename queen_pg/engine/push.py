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


@dataclass(slots=True)
class PreparedPush:
    """Items packed for queen.push_v1: one zstd blob per (queue, partition) group, one hash per item."""

    queues: list[str]
    partitions: list[str]
    blobs: list[bytes]
    item_group: list[int]
    hashes: list[uuid.UUID]
    msgids: list[uuid.UUID]
    txns: list[str]

    def args(self) -> tuple[Any, ...]:
        return (self.queues, self.partitions, self.blobs, self.item_group, self.hashes, self.msgids)


def prepare(items: list[NewMessage]) -> PreparedPush:
    groups: dict[tuple[str, str], int] = {}
    frames: list[list[bytes]] = []
    prepared = PreparedPush([], [], [], [], [], [], [])
    for item in items:
        key = (item.queue, item.partition)
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(groups)
            frames.append([])
        mid = codec.uuid7()
        txn = item.transaction_id or str(mid)
        frames[g].append(codec.encode_frame(mid, txn, item.payload, item.trace_id))
        prepared.item_group.append(g + 1)
        prepared.hashes.append(codec.txn_hash(txn))
        prepared.msgids.append(mid)
        prepared.txns.append(txn)
    prepared.queues = [k[0] for k in groups]
    prepared.partitions = [k[1] for k in groups]
    prepared.blobs = [codec.pack(f) for f in frames]
    return prepared


def result(
    item: NewMessage, txn: str, status: str, message_id: object, partition_id: object, offset: object, index: int
) -> dict[str, Any]:
    """One push result as WIRE.md §2.1 shows it."""
    return {
        "index": index,
        "status": status,
        "transactionId": txn,
        "messageId": str(message_id),
        "queue": item.queue,
        "partition": item.partition,
        "partitionId": str(partition_id),
        "offset": offset,
        "error": None,
    }


async def push(db: Database, tenant: str, items: list[NewMessage]) -> list[dict[str, Any]]:
    """Append ``items``; one result per item, in order (WIRE.md §2.1)."""
    prepared = prepare(items)
    rows = await db.fetch(PUSH_SQL, tenant, *prepared.args())
    return [
        result(item, txn, row["status"], row["message_id"], row["partition_id"], row["msg_offset"], row["idx"] - 1)
        for row, item, txn in zip(rows, items, prepared.txns, strict=True)
    ]
