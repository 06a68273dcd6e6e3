"""Dead letters: list (decoding payloads not yet copied out of their segment) and requeue (at once, for
the consumer groups that dead-lettered the message: ``queen.dlq_requeue_v1``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database, Record
from queen_pg.engine import calls, codec
from queen_pg.engine.answers import AnswerBudget, mark_cut
from queen_pg.engine.pop import iso_ms, wire_group
from queen_pg.security import crypto


@dataclass(frozen=True, slots=True)
class DlqQuery:
    queue: str | None
    group: str | None
    partition: str | None
    since: datetime | None
    until: datetime | None
    limit: int
    offset: int
    max_bytes: int | None = None  # the answer budget (queen_pg/engine/answers.py); None = none


def frame_at(
    blob: bytes, codec_id: int, base_offset: int, dropped: list[int] | None, offset: int
) -> codec.Frame | None:
    """The frame of the message at ``offset`` in a segment, or None when it is not there."""
    skip = set(dropped or ())
    at = base_offset
    for i, frame in enumerate(codec.unpack(blob, codec_id)):
        if i in skip:
            continue
        if at == offset:
            return frame
        at += 1
    return None


def _frame(row: Record) -> codec.Frame | None:
    if row["seg_blob"] is None:
        return None
    return frame_at(row["seg_blob"], row["seg_codec"], row["seg_base"], row["seg_dropped"], row["msg_offset"])


def _payload(tenant: str, row: Record, frame: codec.Frame | None, vault: crypto.Vault) -> Any:
    """A dead letter's payload as JSON text; sealed bytes are opened for its own (tenant, queue,
    partition): a dead letter stays in the partition its message was sealed for."""
    if row["sealed"] is not None:  # an encrypted queue's dead letter, copied out still sealed
        return orjson.Fragment(vault.open(row["sealed"], _place(tenant, row)))
    if row["payload_json"] is not None:
        return orjson.Fragment(row["payload_json"])
    if frame is None:
        return None
    return orjson.Fragment(crypto.opened(vault, frame, _place(tenant, row)) if frame.sealed else frame.payload)


def _place(tenant: str, row: Record) -> crypto.Place:
    return crypto.Place(tenant, row["queue_name"], row["partition_name"])


def _dead(tenant: str, r: Record, frame: codec.Frame | None, vault: crypto.Vault) -> dict[str, Any]:
    # producerSub: the fill job's copy (log_dlq.producer_sub), else the segment's frame
    return {
        "id": str(r["message_id"]) if r["message_id"] else None,
        "dlqId": r["id"],
        "transactionId": r["transaction_id"],
        "queue": r["queue_name"],
        "partition": r["partition_name"],
        "partitionId": str(r["partition_id"]),
        "consumerGroup": wire_group(r["consumer_group"]),
        "offset": r["msg_offset"],
        "data": _payload(tenant, r, frame, vault),
        "producerSub": r["producer_sub"] if r["producer_sub"] is not None else frame.producer_sub if frame else None,
        "errorMessage": r["error"],
        "retryCount": r["attempts"],
        "createdAt": iso_ms(r["created_at"]) if r["created_at"] else None,
        "failedAt": iso_ms(r["failed_at"]),
    }


def _size(row: Record, frame: codec.Frame | None) -> int:
    """The bytes a dead letter adds to the answer: its payload (as stored or decoded) and its error."""
    data = row["sealed"] if row["sealed"] is not None else row["payload_json"]
    if data is None and frame is not None:
        data = frame.payload
    return len(data or b"") + len(row["error"] or "")


async def list_dead(db: Database, tenant: str, q: DlqQuery) -> dict[str, Any]:
    """A page of dead letters, newest first. The procedure stops at the answer budget by stored bytes;
    a dead letter decoded out of a zstd segment is measured here, and the page stops there too."""
    rows = await db.fetch(
        calls.DLQ_LIST, tenant, q.queue, q.group, q.partition, q.since, q.until, q.limit, q.offset, q.max_bytes
    )
    v = crypto.vault(db)
    budget = AnswerBudget(q.max_bytes) if q.max_bytes is not None else None
    messages: list[dict[str, Any]] = []
    for r in rows:
        if r["id"] is None:
            continue  # a page past the end: only the total
        frame = _frame(r)
        if budget is not None and not budget.admit(_size(r, frame)):
            break
        messages.append(_dead(tenant, r, frame, v))
    total = rows[0]["total"] if rows else 0
    return mark_cut({"messages": messages, "total": total, "limit": q.limit, "offset": q.offset}, "messages")


async def requeue(db: Database, tenant: str, partition_id: int, transaction_id: str) -> dict[str, Any]:
    raw = await db.fetchval(calls.DLQ_REQUEUE, tenant, partition_id, codec.txn_hash(transaction_id), codec.uuid7())
    result: dict[str, Any] = orjson.loads(raw)
    return result
