"""Ack: settle delivered messages through one call to ``queen.ack_v3`` (or, under a request key,
``queen.ack_v2``: the outcome window, queen_pg/engine/outcomes.py). An ack is an offset commit
(WIRE.md §9.1, the rules in sql/procedures/040_ack.sql): completing offset N commits the group's
cursor through N, a nack clamps it, and each item's answer says whether it moved it (``noop``)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import xxhash

from queen_pg.db.pool import Database
from queen_pg.db.types import fast_uuid
from queen_pg.engine.leases import LeaseBook, book_of
from queen_pg.engine.outcomes import Once
from queen_pg.engine.pop import QUEUE_MODE, iso_ms

# the items packed (:class:`Packed`), $9 the lease book's hint (queen_pg/engine/leases.py) or NULL; one row
# of sparse verdicts (1-based indexes): refused + their errors, leaseReleased, dlq, noop
ACK_SQL = (
    "SELECT o_refused, o_errors, o_released, o_dlq, o_noop FROM queen.ack_v3($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9)"
)
ACK_ROWS_SQL = "SELECT * FROM queen.ack_v1($1, $2, $3, $4, $5, $6, $7, $8)"  # more kinds than ack_v3's u16 holds
ACK_ONCE_SQL = "SELECT * FROM queen.ack_v2($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, $12)"
EXTEND_SQL = "SELECT * FROM queen.lease_extend_v1($1, $2)"

STATUSES = {"completed": "completed", "success": "completed", "failed": "failed", "retry": "retry", "dlq": "dlq"}


class AckLike(Protocol):
    """An item to settle, as the engine reads it: the ack route's decoded body item (settled as
    decoded, no copy) or an :class:`AckItem`."""

    @property
    def transaction_id(self) -> str: ...
    @property
    def partition_id(self) -> str | int: ...  # as a pop returned it
    @property
    def status(self) -> str: ...  # a key of STATUSES
    @property
    def error(self) -> str | None: ...
    @property
    def group(self) -> str | None: ...
    @property
    def lease_id(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class AckItem:
    transaction_id: str
    partition_id: str
    status: str  # a key of STATUSES
    error: str | None
    group: str | None
    lease_id: str | None


def _refused(index: int, item: AckLike, error: str) -> dict[str, Any]:
    return {
        "index": index,
        "transactionId": item.transaction_id,
        "success": False,
        "error": error,
        "leaseReleased": False,
        "dlq": False,
        "noop": False,
    }


BIGINT_MAX = 2**63 - 1  # a partitionId beyond it is unknown (the driver would refuse the whole call)
_UNPARSED = uuid.UUID(int=0)  # a sentinel: never a lease id (the broker mints version 4)


def cursor_keys(items: Sequence[AckLike]) -> frozenset[tuple[str, str]]:
    """The (partition, group) cursor rows a request settles: two requests that share one are never
    fused (queen_pg/engine/fusion.py), because ack_v1 charges the retry budget and reports
    leaseReleased once per call and cursor row."""
    return frozenset((_pid_key(it.partition_id), it.group or QUEUE_MODE) for it in items)


def _pid_key(partition_id: str | int) -> str:
    try:
        return str(int(partition_id))
    except ValueError:
        return str(partition_id)


_ITEM = struct.Struct("<16sHII")  # queen.ack_v3's p_items: txn hash, kind, txn start, txn length


class Packed:
    """Ack items as ``queen.ack_v3`` takes them: one bytea of fixed-size items (the transactionId's
    xxh3-128, the index of the item's (partition, group, lease, status) kind, where its transactionId
    sits in the concatenated UTF-8 text), the few distinct kinds as arrays, and the error texts only
    when an item has one. A driver encodes a 100-element array parameter element by element (~0.4 µs
    each here); these are a handful of values whatever the batch size."""

    __slots__ = ("_errors", "_hinted", "_items", "_kind_of", "_kinds", "_last", "_txn_at", "_txn_ids", "_txns", "erred")

    def __init__(self) -> None:
        self._items: list[bytes] = []
        self._txns: list[bytes] = []
        self._txn_ids: list[str] = []
        self._hinted: list[tuple[uuid.UUID, int]] = []  # (lease, partition) of the kinds :meth:`hint` hinted
        self._txn_at = 0
        self._kinds: dict[tuple[int, str, uuid.UUID | None, str], int] = {}
        self._last: tuple[int, str, uuid.UUID | None, str, int] | None = None  # the previous item's kind
        self._kind_of: list[int] = []  # each item's kind (the packed u16 holds at most 65535 of them)
        self._errors: list[str | None] = []
        self.erred = False

    def add(self, pid: int, transaction_id: str, lease: uuid.UUID | None, group: str, status: str,
            error: str | None) -> None:  # fmt: skip
        raw = transaction_id.encode()
        last = self._last
        if last is not None and last[0] == pid and last[2] is lease and last[1] == group and last[3] == status:
            kind = last[4]  # a batch's items share one kind: no tuple to hash (a UUID hashes in Python)
        else:
            kind = self._kinds.setdefault((pid, group, lease, status), len(self._kinds) + 1)
            self._last = (pid, group, lease, status, kind)
        self._items.append(_ITEM.pack(xxhash.xxh3_128_digest(raw), kind & 0xFFFF, self._txn_at, len(raw)))
        self._kind_of.append(kind)
        self._txns.append(raw)
        self._txn_ids.append(transaction_id)
        self._txn_at += len(raw)
        self._errors.append(error)
        self.erred = self.erred or error is not None

    MAX_HINTED_KINDS = 64  # beyond (a batch naming many partitions), no hints: ack_v3 matches them per row

    def hint(self, book: LeaseBook) -> list[int | None] | None:
        """``queen.ack_v3``'s p_hint: per kind (3 values, in kind order) the span ``book`` resolves for
        a ``completed`` kind under a lease it handed out (queen_pg/engine/leases.py), NULLs for the
        others; None when no kind has one."""
        kinds = list(self._kinds)
        if not kinds or len(kinds) > self.MAX_HINTED_KINDS:
            return None
        if len(kinds) == 1:
            per: list[list[str]] = [self._txn_ids]
        else:
            per = [[] for _ in kinds]
            for k, t in zip(self._kind_of, self._txn_ids, strict=True):
                per[k - 1].append(t)
        out: list[int | None] = []
        self._hinted = []
        for (pid, _group, lease, status), txns in zip(kinds, per, strict=True):
            got = None
            if lease is not None and status == "completed":
                got = book.hint(lease, pid, txns)
                if got is not None:
                    self._hinted.append((lease, pid))
            out += got if got is not None else (None, None, None)
        return out if self._hinted else None

    def settled(self, book: LeaseBook) -> None:
        """After the call: the book forgets the hinted (lease, partition) parts. A lease is acked once
        as a rule; a second ack of the same part is looked up (same verdicts), and the book stays small."""
        for lease, pid in self._hinted:
            book.settled(lease, pid)

    @property
    def packable(self) -> bool:
        """Whether ``queen.ack_v3`` can take the items (its kind index is a u16); else :meth:`arrays`."""
        return len(self._kinds) <= 0xFFFF

    def args(
        self,
    ) -> tuple[bytes, list[int], list[str], list[uuid.UUID | None], list[str], bytes, list[str | None] | None]:
        """``queen.ack_v3``'s arguments after the tenant."""
        kinds = list(self._kinds)
        return (
            b"".join(self._items),
            [k[0] for k in kinds],
            [k[1] for k in kinds],
            [k[2] for k in kinds],
            [k[3] for k in kinds],
            b"".join(self._txns),
            self._errors if self.erred else None,
        )

    def arrays(self) -> tuple[list[int], list[uuid.UUID], list[str], list[uuid.UUID | None], list[str], list[str],
                              list[str | None]]:  # fmt: skip
        """The same items as ``queen.ack_v1``'s parallel arrays (after the tenant)."""
        kinds = list(self._kinds)
        per = [kinds[k - 1] for k in self._kind_of]
        return (
            [k[0] for k in per],
            [fast_uuid(it[:16]) for it in self._items],
            [t.decode() for t in self._txns],
            [k[2] for k in per],
            [k[1] for k in per],
            [k[3] for k in per],
            self._errors,
        )


async def ack(db: Database, tenant: str, items: Sequence[AckLike], once: Once | None = None) -> list[dict[str, Any]]:
    """One result per item, in order; a refused item is ``success: false`` with its reason. Under a
    request key (``once``) through ``queen.ack_v2``: a retry within the window answers the recorded
    results and settles nothing again."""
    return (await ack_many(db, tenant, [items], once))[0]


async def ack_many(
    db: Database, tenant: str, requests: Sequence[Sequence[AckLike]], once: Once | None = None
) -> list[list[dict[str, Any]]]:
    """Settle several requests' items in ONE ``queen.ack_v3`` call (request fusion); each request
    gets its own results, in its order, indexed from 0. The fuser only combines requests whose
    :func:`cursor_keys` are disjoint, so the call equals running them one after the other. ``once``
    (one request only, never fused) calls ``queen.ack_v2`` instead."""
    items = [it for req in requests for it in req]
    results: list[dict[str, Any] | None] = [None] * len(items)
    sent: list[int] = []
    pack = Packed()
    parsed: dict[str, uuid.UUID | None] = {}
    for i, item in enumerate(items):
        try:
            pid = int(item.partition_id)
        except ValueError:
            pid = -1
        if not 0 <= pid <= BIGINT_MAX:
            results[i] = _refused(i, item, f"unknown partitionId {item.partition_id!r}")
            continue
        lease: uuid.UUID | None = None
        if item.lease_id:
            lease = parsed.get(item.lease_id, _UNPARSED)  # a batch's items share one lease: parsed once
            if lease is _UNPARSED:
                try:
                    lease = parsed[item.lease_id] = uuid.UUID(item.lease_id)
                except ValueError:
                    lease = parsed[item.lease_id] = None
            if lease is None:
                results[i] = _refused(i, item, "lease is not held (unknown leaseId)")
                continue
        sent.append(i)
        pack.add(pid, item.transaction_id, lease, item.group or QUEUE_MODE, STATUSES[item.status], item.error)
    if sent and once is None and pack.packable:
        book = book_of(db)
        hint = pack.hint(book)
        refused, errors, released, dead, noop = (await db.fetch(ACK_SQL, tenant, *pack.args(), hint))[0]
        if hint is not None:
            pack.settled(book)
        why = dict(zip(refused, errors, strict=True))
        released_at, dead_at, noop_at = set(released), set(dead), set(noop)
        for n, i in enumerate(sent, 1):
            error = why.get(n)
            results[i] = {
                "index": i,
                "transactionId": items[i].transaction_id,
                "success": error is None,
                "error": error,
                "leaseReleased": n in released_at,
                "dlq": n in dead_at,
                "noop": n in noop_at,
            }
    elif sent:
        if once is None:  # a batch naming more (partition, group, lease, status) kinds than ack_v3 holds
            rows = await db.fetch(ACK_ROWS_SQL, tenant, *pack.arrays())
        else:
            rows = await db.fetch(ACK_ONCE_SQL, tenant, *pack.arrays(), *once.args())
            once.replayed = bool(rows) and rows[0]["replayed"]
        for row in rows:
            i = sent[row["idx"] - 1]
            results[i] = {
                "index": i,
                "transactionId": items[i].transaction_id,
                "success": row["success"],
                "error": row["error"],
                "leaseReleased": row["lease_released"],
                "dlq": row["dlq"],
                "noop": row["noop"],
            }
    out: list[list[dict[str, Any]]] = []
    start = 0
    for req in requests:
        part = [r for r in results[start : start + len(req)] if r is not None]
        for r in part:
            r["index"] -= start
        out.append(part)
        start += len(req)
    return out


async def extend_lease(db: Database, tenant: str, lease_id: str) -> dict[str, Any]:
    try:
        lid = uuid.UUID(lease_id)
    except ValueError:
        lid = None
    renewed, expires = 0, None
    if lid is not None:
        rows = await db.fetch(EXTEND_SQL, tenant, lid)
        renewed, expires = rows[0]["renewed"], rows[0]["expires_at"]
    stamp = iso_ms(expires) if isinstance(expires, datetime) else None
    answer: dict[str, Any] = {
        "leaseId": lease_id,
        "success": renewed > 0,
        "renewed": renewed,
        "newExpiresAt": stamp,
        "expiresAt": stamp,
        "lease_expires_at": stamp,
    }
    if not renewed:
        answer["error"] = "lease not found or expired"
    return answer
