"""Push: pack items into one segment per (queue, partition), one call to ``queen.push_v3`` (or, under a
request key, ``queen.push_v2``: the outcome window, queen_pg/engine/outcomes.py).

push_v3 takes the items' transactionId hashes and message ids as one bytea each and answers ONE row
(per group its partition id and first offset, and only the duplicates), from which :func:`placed`
derives every item's verdict: encoding 2 × n uuids and decoding n result rows was the broker's largest
cost per pushed message (push_v1, one row per item, stays for the previous release).

Payloads of encrypted queues are sealed here (queen_pg/security/crypto.py), by the database handle's
vault: each group tells push_v1 whether it is sealed, push_v1 refuses a group that disagrees with its
queue (nothing written), and the call is made again sealed as the database said."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from queen_pg.db.pool import Database, Record
from queen_pg.db.types import fast_uuid
from queen_pg.engine import codec
from queen_pg.engine.outcomes import Once
from queen_pg.security import crypto

PUSH_SQL = "SELECT * FROM queen.push_v3($1, $2, $3, $4, $5, $6, $7, NULL, NULL, $8)"
PUSH_ONCE_SQL = "SELECT * FROM queen.push_v2($1, $2, $3, $4, $5, $6, $7, NULL, $8, $9, $10, $11, $12)"


class NewMessage(NamedTuple):
    """One message to append (a tuple: one is built per pushed message)."""

    queue: str
    partition: str
    payload: bytes  # the payload as JSON text
    transaction_id: str | None
    trace_id: uuid.UUID | None
    producer_sub: str | None = None  # the pushing token's sub (JWT on); never taken from the body
    message_id: uuid.UUID | None = None  # client-minted (binary push frames, engine/binary.py); None = mint


@dataclass(slots=True)
class PreparedPush:
    """Items packed for queen.push_v1/v3: one zstd blob per (queue, partition) group; per item its
    group, message id and transactionId, and (16 bytes each, in item order) the xxh3-128 hashes of
    the transactionIds and the message ids."""

    queues: list[str]
    partitions: list[str]
    blobs: list[bytes]
    item_group: list[int]
    msgids: list[uuid.UUID]
    txns: list[str]
    sealed: list[bool]  # per group: its payloads are sealed (the queue is encrypted, as far as we know)
    hash_blob: bytes = b""
    msgid_blob: bytes = b""

    @property
    def hashes(self) -> list[uuid.UUID]:
        h = self.hash_blob
        return [fast_uuid(h[i : i + 16]) for i in range(0, len(h), 16)]

    def args(self) -> tuple[Any, ...]:
        """queen.push_v1's arguments after the tenant, but ``sealed`` (passed last: :attr:`sealed`)."""
        return (self.queues, self.partitions, self.blobs, self.item_group, self.hashes, self.msgids)

    def args_v3(self) -> tuple[Any, ...]:
        """queen.push_v3's arguments after the tenant, but ``sealed``: hashes and ids as 16 × n bytes."""
        return (self.queues, self.partitions, self.blobs, self.item_group, self.hash_blob, self.msgid_blob)


# One item's verdict: (status, message id, partition id, offset); a duplicate's are the original's.
Placed = tuple[str, uuid.UUID, int, int]


def placed(prepared: PreparedPush, row: Record) -> list[Placed]:
    """Every item's verdict, in item order, from push_v3's one row: a queued item's offset is its
    group's base plus the queued items of its group before it; a duplicate is listed by index."""
    pids: list[int] = row["partition_ids"]
    nxt: list[int] = list(row["base_offsets"])
    dup_idx = row["dup_idx"]
    if not dup_idx:
        out: list[Placed] = []
        for g, mid in zip(prepared.item_group, prepared.msgids, strict=True):
            off = nxt[g - 1]
            nxt[g - 1] = off + 1
            out.append(("queued", mid, pids[g - 1], off))
        return out
    dups = dict(zip(dup_idx, zip(row["dup_msgid"], row["dup_offset"], strict=True), strict=True))
    out = []
    for i, (g, mid) in enumerate(zip(prepared.item_group, prepared.msgids, strict=True), 1):
        dup = dups.get(i)
        if dup is None:
            off = nxt[g - 1]
            nxt[g - 1] = off + 1
            out.append(("queued", mid, pids[g - 1], off))
        else:
            out.append(("duplicate", dup[0], pids[g - 1], dup[1]))
    return out


def rows_placed(rows: Sequence[Record]) -> list[Placed]:
    """push_v1/push_v2 rows (one per item) as :data:`Placed`."""
    return [(r["status"], r["message_id"], r["partition_id"], r["msg_offset"]) for r in rows]


_PLAIN = struct.Struct("<IB16sH")  # a QPF1 frame's head without trace id or producerSub (codec.encode_frame)


def prepare(items: list[NewMessage], vault: crypto.Vault | None = None, tenant: str = "") -> PreparedPush:
    """Pack ``items``; with a ``vault``, the payloads of the queues it believes encrypted are sealed.
    The ids of the items without one are minted at once (``codec.uuid7_blob``), the transactionIds
    hashed in one pass after the loop, and a plain frame (no trace id, no producerSub, not sealed)
    packed with one struct call."""
    groups: dict[tuple[str, str], int] = {}
    frames: list[list[bytes]] = []
    sealed: list[bool] = []
    item_group: list[int] = []
    msgids: list[uuid.UUID] = []
    txns: list[str] = []
    encoded: list[bytes] = []
    minted = codec.uuid7_blob(len(items))
    own_ids = False  # some item brought its message id: msgid_blob is joined from the items'
    at = 0
    last_q: str | None = None
    last_p: str | None = None
    out: list[bytes] = []
    seal = False
    gid = 0
    pack_plain = _PLAIN.pack
    for queue, partition, payload, txn, trace, sub, mid in items:
        if queue != last_q or partition != last_p:  # a request's items mostly share one partition
            key = (queue, partition)
            g = groups.get(key)
            if g is None:
                g = groups[key] = len(groups)
                frames.append([])
                sealed.append(vault is not None and vault.encrypted(tenant, queue))
            last_q, last_p, out, seal, gid = queue, partition, frames[g], sealed[g], g + 1
        if mid is None:
            raw = minted[at : at + 16]
            mid = fast_uuid(raw)
        else:
            raw = mid.bytes
            own_ids = True
        at += 16
        if txn is None:
            txn = str(mid)
        t = txn.encode()
        if trace is None and sub is None and not seal:
            out.append(pack_plain(len(t) + len(payload) + 19, 0, raw, len(t)) + t + payload)
        else:
            if seal:
                assert vault is not None
                payload = vault.seal(payload)
            out.append(codec.encode_frame(mid, txn, payload, trace, sub, sealed=seal))
        item_group.append(gid)
        msgids.append(mid)
        txns.append(txn)
        encoded.append(t)
    return PreparedPush(
        [k[0] for k in groups],
        [k[1] for k in groups],
        [codec.pack(f) for f in frames],
        item_group,
        msgids,
        txns,
        sealed,
        codec.txn_hashes(encoded),
        b"".join([m.bytes for m in msgids]) if own_ids else minted,
    )


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


async def push(db: Database, tenant: str, items: list[NewMessage], once: Once | None = None) -> list[dict[str, Any]]:
    """Append ``items``; one result per item, in order (WIRE.md §2.1). Under a request key (``once``)
    through ``queen.push_v2``: a retry within the window answers the recorded results, adding nothing."""
    if once is None:
        return (await push_many(db, tenant, [items]))[0]
    v = crypto.vault(db)

    async def attempt() -> list[Record]:
        prepared = prepare(items, v, tenant)
        return await db.fetch(PUSH_ONCE_SQL, tenant, *prepared.args(), *once.args(), prepared.sealed)

    rows = await crypto.push_sealed(v, tenant, (it.queue for it in items), attempt)
    once.replayed = bool(rows) and rows[0]["replayed"]
    return _render(items, rows_placed(rows))


async def push_many(db: Database, tenant: str, requests: list[list[NewMessage]]) -> list[list[dict[str, Any]]]:
    """Append several requests' items in ONE ``queen.push_v1`` call (request fusion,
    queen_pg/engine/fusion.py); each request gets exactly its own results, in its order, indexed
    from 0. Fusing is the same as running the requests one after the other in list order: offsets
    stay gapless per partition and an item repeating an earlier request's transactionId is that
    item's ``duplicate``, with the first one's messageId."""
    flat = [it for req in requests for it in req]
    v = crypto.vault(db)

    async def attempt() -> list[Placed]:
        prepared = prepare(flat, v, tenant)
        (row,) = await db.fetch(PUSH_SQL, tenant, *prepared.args_v3(), prepared.sealed)
        return placed(prepared, row)

    rows = await crypto.push_sealed(v, tenant, {it.queue for it in flat}, attempt)
    out: list[list[dict[str, Any]]] = []
    start = 0
    for req in requests:
        out.append(_render(req, rows[start : start + len(req)]))
        start += len(req)
    return out


def _render(items: list[NewMessage], rows: Sequence[Placed]) -> list[dict[str, Any]]:
    # An item without a transactionId got its message id as one: a duplicate of it is impossible, so
    # the row's message id is its transactionId (also when the rows are a replayed record).
    out: list[dict[str, Any]] = []
    pid_text: dict[int, str] = {}
    for i, ((status, mid, pid, off), item) in enumerate(zip(rows, items, strict=True)):
        ptext = pid_text.get(pid)
        if ptext is None:
            ptext = pid_text[pid] = str(pid)
        mtext = str(mid)
        out.append(
            {
                "index": i,
                "status": status,
                "transactionId": item.transaction_id or mtext,
                "messageId": mtext,
                "queue": item.queue,
                "partition": item.partition,
                "partitionId": ptext,
                "offset": off,
                "error": None,
            }
        )
    return out
