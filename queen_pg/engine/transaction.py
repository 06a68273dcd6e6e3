"""Transaction: a worker's whole step (acks, pushes, KV, timers) in one call to queen.transaction_v1.

The broker validates and packs; SQL decides under locks and either commits everything or raises a
verdict (rejected_ack, duplicate, kv_precondition, reserved) that rolls everything back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls, codec, sealing
from queen_pg.engine import push as push_engine
from queen_pg.engine.ack import BIGINT_MAX, STATUSES
from queen_pg.engine.outcomes import Once
from queen_pg.engine.pop import QUEUE_MODE
from queen_pg.engine.timers import ops_text, timer_payloads
from queen_pg.errors import Verdict
from queen_pg.security import crypto


@dataclass(frozen=True, slots=True)
class TxAck:
    index: int  # flat index (docs/wire.md#transaction)
    transaction_id: str
    partition_id: str
    status: str
    group: str | None
    lease_id: str | None


@dataclass(frozen=True, slots=True)
class TxPush:
    index: int
    item: push_engine.NewMessage


@dataclass(slots=True)
class TxTimers:
    ops: list[dict[str, Any]] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    hashes: list[uuid.UUID] = field(default_factory=list)
    msgids: list[uuid.UUID] = field(default_factory=list)
    producer_sub: str | None = None  # the token's sub: the fired messages' producerSub


@dataclass(slots=True)
class TxBundle:
    acks: list[TxAck]
    pushes: list[TxPush]
    required_leases: list[str]
    kv: list[dict[str, Any]]
    timers: TxTimers
    slots: int  # acks + push items: the flat index of kv[0]
    # the pushes already packed (a binary transaction's blobs stored as they came, engine/push_binary.py)
    prepared: push_engine.PreparedPush | None = None


def _refuse_ack(ack: TxAck, why: str) -> Verdict:
    return Verdict(
        "rejected_ack",
        {
            "failedIndex": ack.index,
            "transactionId": ack.transaction_id,
            "partitionId": ack.partition_id,
            "error": f"transaction rolled back: ack of {ack.transaction_id} refused: {why}",
        },
    )


async def commit(
    db: Database, tenant: str, tx: TxBundle, once: Once | None = None, max_bytes: int | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Commit the bundle: (the answer, the queues whose parked pops to wake: those it pushed to, and
    those where its acks left a partition claimable). Raises Verdict when it rolled back (nothing
    written). Under a request key
    (``once``) through ``queen.transaction_v2``: a retry within the window answers the recorded result
    (same transactionId, same results) and commits nothing again.

    ``max_bytes`` is the answer budget of the KV results (queen_pg/engine/answers.py; None = none), as
    POST /api/v1/kv has it: past it the call is 413 ``answer_too_large`` and nothing of the bundle is
    written."""
    pids: list[int] = []
    leases: list[uuid.UUID | None] = []
    for ack in tx.acks:
        try:
            pid = int(ack.partition_id)
        except ValueError:
            pid = -1
        if not 0 <= pid <= BIGINT_MAX:  # beyond bigint the driver would refuse the whole call
            raise _refuse_ack(ack, f"unknown partitionId {ack.partition_id!r}")
        pids.append(pid)
        try:
            leases.append(uuid.UUID(ack.lease_id) if ack.lease_id else None)
        except ValueError:
            raise _refuse_ack(ack, "lease is not held (unknown leaseId)") from None
    required: list[uuid.UUID] = []
    for lease in tx.required_leases:
        try:
            required.append(uuid.UUID(lease))
        except ValueError:
            raise Verdict(
                "rejected_ack",
                {"leaseId": lease, "error": f"transaction rolled back: required lease {lease} is not held"},
            ) from None
    items = [p.item for p in tx.pushes]
    txid = str(codec.uuid7())
    v = crypto.vault(db)

    async def attempt() -> tuple[Any, bool]:
        # a binary transaction's blobs go as they are unless a queue is (believed) encrypted: then every
        # push is packed as JSON's are, encrypted queues' payloads sealed (crypto.py)
        if tx.prepared is not None and not any(v.encrypted(tenant, it.queue) for it in items):
            prepared = tx.prepared
        else:
            prepared = push_engine.prepare(items, v, tenant)
        args = (
            tenant,
            pids,
            [codec.txn_hash(a.transaction_id) for a in tx.acks],
            [a.transaction_id for a in tx.acks],
            leases,
            [a.group or QUEUE_MODE for a in tx.acks],
            [STATUSES[a.status] for a in tx.acks],
            [a.index for a in tx.acks],
            required,
            *prepared.args(),
            [p.index for p in tx.pushes],
            prepared.txns,
            orjson.dumps(tx.kv).decode(),
            tx.slots,
            ops_text(tx.timers.ops, tx.timers.producer_sub),
            timer_payloads(v, tenant, tx.timers.ops, tx.timers.payloads),
            tx.timers.hashes,
            tx.timers.msgids,
            tx.slots + len(tx.kv),
        )
        if once is None:
            return await db.fetchval(calls.TRANSACTION, *args, prepared.sealed, max_bytes), False
        rows = await db.fetch(calls.TRANSACTION_ONCE, *args, *once.args(), txid, prepared.sealed, max_bytes)
        return rows[0]["result"], rows[0]["replayed"]

    queues = [it.queue for it in items] + [str(op.get("queue")) for op in tx.timers.ops]
    raw, replayed = await sealing.push_sealed(v, tenant, queues, attempt)
    if once is not None:
        once.replayed = replayed
    out = orjson.loads(raw)
    results: list[Any] = [None] * (tx.slots + len(tx.kv) + len(tx.timers.ops))
    for ack, res in zip(tx.acks, out["acks"], strict=True):
        results[ack.index] = {"index": ack.index, "type": "ack", "transactionId": ack.transaction_id, **res}
    for p, res in zip(tx.pushes, out["pushes"], strict=True):
        txn = p.item.transaction_id or str(res["messageId"])  # a replay: not this call's minted ids
        pushed = push_engine.result(
            p.item, txn, res["status"], res["messageId"], res["partitionId"], res["offset"], p.index
        )
        results[p.index] = {"type": "push", **pushed}
    for res in out["kv"] + out["timers"]:
        results[res["index"]] = res
    wake = sorted({it.queue for it in items}.union(out.get("wake") or ()))
    return {"transactionId": out.get("transactionId") or txid, "success": True, "results": results}, wake
