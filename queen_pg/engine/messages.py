"""Messages: browse a queue's log, read one message, delete one; one procedure call each
(``sql/procedures/110_messages.sql``).

SQL hands out the segments; this module decodes their QPF1 frames (zstd or raw) and slices out the
requested messages. Message k of a segment, counted over the frames not listed in ``dropped``, has
offset ``base_offset + k``. Payloads are returned as the stored JSON bytes (``orjson.Fragment``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database, Record
from queen_pg.engine import calls, codec
from queen_pg.engine.answers import AnswerBudget, mark_cut
from queen_pg.engine.pop import iso_ms, not_found, wire_group
from queen_pg.errors import NOT_FOUND, QueenError
from queen_pg.security import crypto


@dataclass(frozen=True, slots=True)
class MessageQuery:
    queue: str
    partition: str | None
    from_offset: int | None  # log offsets [from_offset, to_offset), per partition
    to_offset: int | None
    since: datetime | None  # segment write time [since, until)
    until: datetime | None
    descending: bool
    group: str | None  # report each message's state for this group
    limit: int
    offset: int
    status: str | None = None  # only the messages in this state for ``group`` (consumed|leased|pending|dead)
    max_bytes: int | None = None  # the answer budget (queen_pg/engine/answers.py); None = none


def _frames(row: Record) -> list[tuple[int, codec.Frame]]:
    """(offset, frame) of every message of the row's segment that lies in [lo, hi), ascending."""
    skip = set(row["dropped"] or ())
    out: list[tuple[int, codec.Frame]] = []
    at = row["base_offset"]
    for i, frame in enumerate(codec.unpack(row["payload"], row["codec"])):
        if i in skip:
            continue
        if row["lo"] <= at < row["hi"]:
            out.append((at, frame))
        at += 1
    return out


STATES = {"d": "dead", "c": "consumed", "l": "leased", "p": "pending"}


def _state(row: Record, off: int) -> str:
    """The message's state for the query's group, as messages_list_v3 decided it (``states``: one
    letter per offset of [lo, hi))."""
    return STATES[row["states"][off - row["lo"]]]


def _message(
    tenant: str,
    queue: str,
    partition: str,
    pid: int,
    off: int,
    frame: codec.Frame,
    created: datetime,
    vault: crypto.Vault,
) -> dict[str, Any]:
    return {
        "id": str(frame.message_id),
        "transactionId": frame.transaction_id,
        "traceId": str(frame.trace_id) if frame.trace_id else None,
        "producerSub": frame.producer_sub,
        "queue": queue,
        "partition": partition,
        "partitionId": str(pid),
        "offset": off,
        "createdAt": iso_ms(created),
        "data": orjson.Fragment(
            crypto.opened(vault, frame, crypto.Place(tenant, queue, partition)) if frame.sealed else frame.payload
        ),
    }


async def list_messages(db: Database, tenant: str, q: MessageQuery) -> dict[str, Any]:
    rows = await db.fetch(
        calls.MESSAGES_LIST,
        tenant,
        q.queue,
        q.partition,
        q.from_offset,
        q.to_offset,
        q.since,
        q.until,
        q.descending,
        q.group,
        q.limit,
        q.offset,
        q.status,
        q.max_bytes,
    )
    if not rows or rows[0]["status"] != "ok":
        raise not_found(rows[0]["status"] if rows else "no_queue", q.queue, q.partition, q.group)
    messages = _page(tenant, rows, q, crypto.vault(db))
    return mark_cut(
        {
            "messages": messages,
            "total": rows[0]["total"],
            "limit": q.limit,
            "offset": q.offset,
            "queue": q.queue,
            "partition": q.partition,
            "order": "desc" if q.descending else "asc",
        },
        "messages",
    )


def _page(tenant: str, rows: list[Record], q: MessageQuery, v: crypto.Vault) -> list[dict[str, Any]]:
    """The page's messages from its segments, in page order, until they reach the answer budget (the
    procedure stopped by stored bytes; a zstd segment decodes larger, so decoding stops here too)."""
    messages: list[dict[str, Any]] = []
    end = q.offset + q.limit
    budget = AnswerBudget(q.max_bytes) if q.max_bytes is not None else None
    for row in rows:
        if row["partition_id"] is None:
            continue  # a page past the end: only the total
        frames = _frames(row)
        if q.status is not None:  # the procedure counted (skip, total) over the messages in that state
            frames = [(off, frame) for off, frame in frames if _state(row, off) == q.status]
        if q.descending:
            frames.reverse()
        for i, (off, frame) in enumerate(frames, start=row["skip"]):
            if q.offset <= i < end:
                if budget is not None and not budget.admit(len(frame.payload) + len(frame.transaction_id)):
                    return messages
                msg = _message(
                    tenant, q.queue, row["partition_name"], row["partition_id"], off, frame, row["created_at"], v
                )
                if q.group is not None:
                    msg["consumerGroup"] = wire_group(q.group)
                    msg["status"] = _state(row, off)
                messages.append(msg)
    return messages


def _missing(partition_id: int, transaction_id: str) -> QueenError:
    return QueenError(NOT_FOUND, detail=f"no message {transaction_id!r} in partition {partition_id}")


def overall_status(groups: list[dict[str, Any]]) -> str:
    """One word for the message across its groups (docs/wire.md#message-detail): ``dead_letter`` when a group
    dead-lettered it, else ``processing`` when a group holds it under a live lease, else ``pending``
    when a group has not consumed it (or no group reads the partition yet), else ``completed``."""
    if any(g["state"] == "dead" for g in groups):
        return "dead_letter"
    if any(g["state"] == "leased" for g in groups):
        return "processing"
    if not groups or any(not g["consumed"] for g in groups):
        return "pending"
    return "completed"


def _detail(row: Record, msg: dict[str, Any]) -> dict[str, Any]:
    """The docs/wire.md#message-detail fields of one message's detail, beside the fields of the browser's answer."""
    groups: list[dict[str, Any]] = orjson.loads(row["groups"])
    dead: list[dict[str, Any]] = orjson.loads(row["dead"])
    retries = [g["deliveries"] - 1 for g in groups if g["deliveries"]] + [d["attempts"] - 1 for d in dead]
    leases = [g["leaseExpiresAt"] for g in groups if g["leaseExpiresAt"]]
    return {
        **msg,
        "namespace": row["namespace"],
        "task": row["task"],
        "status": overall_status(groups),
        "payload": msg["data"],
        "errorMessage": dead[-1]["error"] if dead else None,
        "retryCount": max([0, *retries]),
        "leaseExpiresAt": max(leases) if leases else None,  # one format (queen._iso_utc): sorts as text
        "queueConfig": orjson.Fragment(row["queue_config"]),
        "consumerGroups": [
            {"name": g["group"], "consumed": g["consumed"], "leaseExpiresAt": g["leaseExpiresAt"]} for g in groups
        ],
        "offsets": list(row["offsets"]),  # every message this transactionId names here
        "groups": [{k: g[k] for k in ("name", "queueMode", "cursor", "state")} for g in groups],
        "deadLetters": dead,
    }


async def get_message(db: Database, tenant: str, partition_id: int, transaction_id: str) -> dict[str, Any]:
    """The newest message of that transactionId in the partition, decoded, with its state in every
    consumer group that has a cursor on the partition (docs/wire.md#message-detail)."""
    rows = await db.fetch(calls.MESSAGE_GET, tenant, partition_id, codec.txn_hash(transaction_id))
    row = rows[0] if rows else None
    if row is None or row["status"] == "no_partition":
        raise QueenError(NOT_FOUND, detail=f"partition {partition_id} not found")
    if row["status"] != "ok" or row["payload"] is None:
        raise _missing(partition_id, transaction_id)
    skip = set(row["dropped"] or ())
    at = row["base_offset"]
    for i, frame in enumerate(codec.unpack(row["payload"], row["codec"])):
        if i in skip:
            continue
        if at == row["msg_offset"]:
            if frame.transaction_id != transaction_id:
                break  # a hash collision: not this message
            msg = _message(
                tenant,
                row["queue_name"],
                row["partition_name"],
                partition_id,
                at,
                frame,
                row["created_at"],
                crypto.vault(db),
            )
            return {**_detail(row, msg), "isEncrypted": frame.sealed}
        at += 1
    raise _missing(partition_id, transaction_id)


async def delete_message(db: Database, tenant: str, partition_id: int, transaction_id: str) -> dict[str, Any]:
    """Settle the message for every consumer group, drop its dead letters and its transactionId hash
    (see ``queen.message_delete_v1``: a log cannot drop bytes from its middle)."""
    result: dict[str, Any] = orjson.loads(
        await db.fetchval(calls.MESSAGE_DELETE, tenant, partition_id, codec.txn_hash(transaction_id))
    )
    if result["status"] == "no_partition":
        raise QueenError(NOT_FOUND, detail=f"partition {partition_id} not found")
    if result["status"] != "deleted":
        raise _missing(partition_id, transaction_id)
    return {"success": True, "deleted": True, "transactionId": transaction_id, **result}
