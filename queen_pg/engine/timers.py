"""Timers: schedule/cancel/read through the ``queen.timer*_v1`` procedures, and fire due timers.

Every write holds the timer key's advisory lock (sql/procedures/086_timers.sql, docs/architecture.md#row-lock-order 0b).
The firing job pushes each due timer as a message with ``transactionId == txn``, ``id == messageId``
and ``data ==`` the payload, exactly once, and deletes it in the same transaction (docs/wire.md#timers-no-tombstone: no
tombstone; after the fire a peek is ``found: false`` and a cancel ``absent``).

A timer of an encrypted queue keeps its payload sealed in ``queen.timers`` (queen_pg/security/crypto.py);
the fire frames it as it is (flag 4) and a peek opens it. The scheduling token's sub (JWT on) is the fired
message's producerSub (flag 2), like a push's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls, sealing
from queen_pg.security import crypto


def iso_us(ts: datetime) -> str:
    """UTC, microseconds, like ``queen._iso_utc`` (the timestamps SQL renders in timer results)."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def apply(
    db: Database,
    tenant: str,
    ops: list[dict[str, Any]],
    payloads: list[bytes],
    hashes: list[uuid.UUID],
    message_ids: list[uuid.UUID],
    now: datetime | None = None,
    producer_sub: str | None = None,
) -> list[dict[str, Any]]:
    """Apply validated ops (``queen_pg.api.timers.ops``) in one transaction; one result per op. The
    payloads of an encrypted queue's schedules are sealed (the procedure refuses a disagreement);
    ``producer_sub`` (the token's sub) becomes the fired messages' producerSub."""
    v = crypto.vault(db)
    text = ops_text(ops, producer_sub)

    async def attempt() -> Any:
        sealed = timer_payloads(v, tenant, ops, payloads)
        return await db.fetchval(calls.TIMERS, tenant, text, sealed, hashes, message_ids, now)

    raw = await sealing.push_sealed(v, tenant, [str(op.get("queue")) for op in ops], attempt)
    results: list[dict[str, Any]] = orjson.loads(raw)["results"]
    return results


def ops_text(ops: list[dict[str, Any]], producer_sub: str | None) -> str:
    """The ops as the procedures take them (jsonb text): each schedule gets the scheduler's
    ``producerSub`` (the token's sub; a client's own is refused as server-owned, api/timers/ops.py)."""
    if producer_sub is None:
        return orjson.dumps(ops).decode()
    stamped = [op if op.get("op") == "cancel" else {**op, "producerSub": producer_sub} for op in ops]
    return orjson.dumps(stamped).decode()


def timer_payloads(v: crypto.Vault, tenant: str, ops: list[dict[str, Any]], payloads: list[bytes]) -> list[bytes]:
    """Each op's payload as ``queen.timers`` is to keep it: sealed for a schedule into a queue ``v``
    believes encrypted, for the (tenant, queue, partition) the timer fires into (its row names the
    same place, so its peek opens it too)."""
    return [
        v.seal_for(place(tenant, op), p)[0] if op.get("op") != "cancel" else p
        for op, p in zip(ops, payloads, strict=True)
    ]


def place(tenant: str, op: dict[str, Any]) -> crypto.Place:
    """Where a schedule op's message lands (``queen._timer_apply``: partition ``Default`` when none)."""
    return crypto.Place(tenant, str(op.get("queue")), str(op.get("partition") or "Default"))


async def cancel(
    db: Database, tenant: str, queue: str, timer_key: str, txn: str | None, now: datetime | None = None
) -> dict[str, Any]:
    """``cancelled``, ``absent`` or ``too_late`` (see queen.timer_cancel_v1)."""
    result: dict[str, Any] = orjson.loads(await db.fetchval(calls.TIMER_CANCEL, tenant, queue, timer_key, txn, now))
    return result


async def get(db: Database, tenant: str, queue: str, timer_key: str) -> dict[str, Any]:
    """The pending timer, or ``{"found": false}`` (never scheduled, cancelled, or already fired)."""
    rows = await db.fetch(calls.TIMER_GET, tenant, queue, timer_key)
    if not rows:
        return {"found": False}
    r = rows[0]
    stored: bytes = r["payload"]
    payload = crypto.vault(db).clear(stored, crypto.Place(tenant, queue, r["partition"]))
    return {
        "found": True,
        "queue": queue,
        "timerKey": timer_key,
        "txn": r["txn"],
        "messageId": str(r["message_id"]),
        "deliverAt": iso_us(r["deliver_at"]),
        "partition": r["partition"],
        "data": orjson.Fragment(payload),  # validated JSON when scheduled; given once (no base64 copy)
        "encrypted": crypto.is_sealed(stored),
    }


async def list_pending(
    db: Database, tenant: str, queue: str, after: str | None, limit: int, max_bytes: int | None = None
) -> dict[str, Any]:
    """A keyset page of the queue's pending timers by timerKey; ``nextAfter`` when truncated. The page
    also stops early (``truncated``) at ``max_bytes``, the answer budget (None = none)."""
    page: dict[str, Any] = orjson.loads(await db.fetchval(calls.TIMER_LIST, tenant, queue, after, limit, max_bytes))
    return page


@dataclass(frozen=True, slots=True)
class FireResult:
    leader: bool  # false: another replica held the job's key this tick
    fired: int  # messages pushed
    duplicates: int  # fired timers whose txn was already in the partition's dedup window
    busy: int  # due timers skipped because a writer held their key
    queues: list[tuple[str, str]]  # (tenant, queue) that received a message


async def fire(db: Database, limit: int, now: datetime | None = None) -> FireResult:
    """Fire up to ``limit`` due timers (one call); each fired timer's row is deleted with its push."""
    out = orjson.loads(await db.fetchval(calls.TIMERS_FIRE, limit, now))
    return FireResult(
        leader=bool(out["leader"]),
        fired=int(out["fired"]),
        duplicates=int(out["duplicates"]),
        busy=int(out["busy"]),
        queues=[(t, q) for t, q in out["queues"]],
    )
