"""Ack: settle delivered messages through one call to ``queen.ack_v3`` (or, under a request key,
``queen.ack_v2``: the outcome window, queen_pg/engine/outcomes.py). An ack is an offset commit
(WIRE.md §9.1, the rules in sql/procedures/040_ack.sql): completing offset N commits the group's
cursor through N, a nack clamps it, and each item's answer says whether it moved it (``noop``)."""

from __future__ import annotations

import logging
import operator
import struct
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, islice
from typing import Any, Protocol, overload

import orjson
import xxhash

from queen_pg.db.pool import Database
from queen_pg.db.types import fast_uuid
from queen_pg.engine.leases import LeaseBook, book_of
from queen_pg.engine.outcomes import Once
from queen_pg.engine.pop import QUEUE_MODE, iso_ms
from queen_pg.engine.pop_render import NO_CACHE, SegmentCache, cache_of
from queen_pg.errors import QueenError

# the items packed (:class:`Packed`), $9 the lease book's hint (queen_pg/engine/leases.py) or NULL; one row
# of sparse verdicts (1-based indexes): refused + their errors, leaseReleased, dlq, noop; and the queues
# whose parked pops to wake (a cursor row left claimable: its lease released with messages left, a nack)
ACK_SQL = (
    "SELECT o_refused, o_errors, o_released, o_dlq, o_noop, o_wake"
    " FROM queen.ack_v3($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9)"
)
ACK_ROWS_SQL = "SELECT * FROM queen.ack_v1($1, $2, $3, $4, $5, $6, $7, $8)"  # more kinds than ack_v3's u16 holds
ACK_ONCE_SQL = "SELECT * FROM queen.ack_v2($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, $12)"
EXTEND_SQL = "SELECT * FROM queen.lease_extend_v1($1, $2)"
WAKES_SQL = "SELECT queen._ack_wakes($1, $2, $3)"  # after an ack_v1/ack_v2 call: ack_v3 answers it itself

log = logging.getLogger("queen_pg.ack")

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
    raw = {(it.partition_id, it.group) for it in items}  # a batch names one or a few: parsed once each
    return frozenset((_pid_key(p), g or QUEUE_MODE) for p, g in raw)


def _pid_key(partition_id: str | int) -> str:
    try:
        return str(int(partition_id))
    except ValueError:
        return str(partition_id)


_ITEM = "16sHII"  # queen.ack_v3's p_items, per item: txn hash, kind, txn start, txn length (little-endian)
_CHUNK = 64
_CHUNKED = struct.Struct("<" + _ITEM * _CHUNK)  # _CHUNK items in one pack


class Packed:
    """Ack items as ``queen.ack_v3`` takes them: one bytea of fixed-size items (the transactionId's
    xxh3-128, the index of the item's (partition, group, lease, status) kind, where its transactionId
    sits in the concatenated UTF-8 text), the few distinct kinds as arrays, and the error texts only
    when an item has one. A driver encodes a 100-element array parameter element by element (~0.4 µs
    each here); these are a handful of values whatever the batch size."""

    __slots__ = ("_errors", "_hinted", "_kind_of", "_kinds", "_last", "_txn_ids", "_txns", "erred")

    def __init__(self) -> None:
        self._txns: list[bytes] = []
        self._txn_ids: list[str] = []
        self._hinted: list[tuple[uuid.UUID, int]] = []  # (lease, partition) of the kinds :meth:`hint` hinted
        self._kinds: dict[tuple[int, str, uuid.UUID | None, str], int] = {}
        self._last: tuple[int, str, uuid.UUID | None, str, int] | None = None  # the previous item's kind
        self._kind_of: list[int] = []  # each item's kind (the packed u16 holds at most 65535 of them)
        self._errors: dict[int, str] = {}  # item position -> its error text (most items have none)
        self.erred = False

    def add(self, pid: int, transaction_id: str, lease: uuid.UUID | None, group: str, status: str,
            error: str | None) -> None:  # fmt: skip
        """One item; the fixed-size items are packed once, by :meth:`args` (a tight loop, not per call)."""
        last = self._last
        if last is not None and last[0] == pid and last[2] is lease and last[1] == group and last[3] == status:
            kind = last[4]  # a batch's items share one kind: no tuple to hash (a UUID hashes in Python)
        else:
            kind = self._kinds.setdefault((pid, group, lease, status), len(self._kinds) + 1)
            self._last = (pid, group, lease, status, kind)
        if error is not None:
            self._errors[len(self._txns)] = error
            self.erred = True
        self._kind_of.append(kind)
        self._txns.append(transaction_id.encode())
        self._txn_ids.append(transaction_id)

    def add_kind(self, pid: int, transaction_ids: list[str], lease: uuid.UUID | None, group: str,
                 status: str) -> None:  # fmt: skip
        """:meth:`add` for items of one kind, none with an error text (a usual batch), without a call per item."""
        last = self._last
        if last is not None and last[0] == pid and last[2] is lease and last[1] == group and last[3] == status:
            kind = last[4]
        else:
            kind = self._kinds.setdefault((pid, group, lease, status), len(self._kinds) + 1)
            self._last = (pid, group, lease, status, kind)
        self._kind_of += [kind] * len(transaction_ids)
        self._txns += map(str.encode, transaction_ids)
        self._txn_ids += transaction_ids

    def _items(self) -> bytes:
        """The packed items: per item its transactionId's xxh3-128, kind, and where its text sits.
        Packed by columns, :data:`_CHUNK` items per ``struct`` call (no Python work per item)."""
        txns = self._txns
        lens = list(map(len, txns))
        cols: list[Any] = [None] * (4 * len(txns))
        cols[0::4] = list(map(xxhash.xxh3_128_digest, txns))
        cols[1::4] = [k & 0xFFFF for k in self._kind_of] if len(self._kinds) > 0xFFFF else self._kind_of
        cols[2::4] = list(accumulate(lens, initial=0))[:-1]
        cols[3::4] = lens
        step = 4 * _CHUNK
        out = [_CHUNKED.pack(*cols[i : i + step]) for i in range(0, len(cols) - step + 1, step)]
        tail = len(txns) % _CHUNK
        if tail:
            out.append(struct.pack("<" + _ITEM * tail, *cols[len(cols) - 4 * tail :]))
        return b"".join(out)

    def _error_list(self) -> list[str | None]:
        errors = self._errors
        return [errors.get(i) for i in range(len(self._txns))]

    MAX_HINTED_KINDS = 64  # beyond (a batch naming many partitions), no hints: ack_v3 matches them per row

    def hint(self, book: LeaseBook, cache: SegmentCache = NO_CACHE) -> list[int | None] | None:
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
                got = book.hint(lease, pid, txns, cache)
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
            self._items(),
            [k[0] for k in kinds],
            [k[1] for k in kinds],
            [k[2] for k in kinds],
            [k[3] for k in kinds],
            b"".join(self._txns),
            self._error_list() if self.erred else None,
        )

    def rows(self) -> tuple[list[int], list[str]]:
        """The distinct cursor rows (partition ids, groups) the items name, as ``queen._ack_wakes`` takes them."""
        rows = {(k[0], k[1]) for k in self._kinds}
        return [r[0] for r in rows], [r[1] for r in rows]

    def arrays(self) -> tuple[list[int], list[uuid.UUID], list[str], list[uuid.UUID | None], list[str], list[str],
                              list[str | None]]:  # fmt: skip
        """The same items as ``queen.ack_v1``'s parallel arrays (after the tenant)."""
        kinds = list(self._kinds)
        per = [kinds[k - 1] for k in self._kind_of]
        return (
            [k[0] for k in per],
            [fast_uuid(xxhash.xxh3_128_digest(t)) for t in self._txns],
            [t.decode() for t in self._txns],
            [k[2] for k in per],
            [k[1] for k in per],
            [k[3] for k in per],
            self._error_list(),
        )


async def _wakes(db: Database, tenant: str, pack: Packed) -> Sequence[str]:
    """``queen._ack_wakes`` after an ack_v1/ack_v2 call, which committed: a wake is a hint, so a
    failed look-up answers none (the parked pops' re-check covers it) rather than turning the committed
    ack into an error."""
    try:
        got: Sequence[str] = await db.fetchval(WAKES_SQL, tenant, *pack.rows())
    except QueenError as exc:
        log.warning("event=ack_wakes_error error=%s", exc)
        return ()
    return got


async def ack(db: Database, tenant: str, items: Sequence[AckLike], once: Once | None = None) -> AckResults:
    """One result per item, in order; a refused item is ``success: false`` with its reason. Under a
    request key (``once``) through ``queen.ack_v2``: a retry within the window answers the recorded
    results and settles nothing again."""
    return (await ack_many(db, tenant, [items], once))[0]


_dumps = orjson.dumps
_KIND = operator.attrgetter("partition_id", "lease_id", "group", "status", "error")
_STATUS = operator.attrgetter("status")
_RESULT_OK = (  # one applied item's answer, as orjson.dumps writes its dict
    b'{"index":%d,"transactionId":%s,"success":true,"error":null,"leaseReleased":false,"dlq":false,"noop":false}'
)


class _Verdicts:
    """One settle call's verdicts by the call's item index: the refusals (error text), the items that
    released their lease, went to the DLQ, or moved nothing (``noop``). Items named nowhere succeeded."""

    __slots__ = ("dead", "errors", "items", "noop", "released")

    def __init__(self, items: Sequence[AckLike]) -> None:
        self.items = items
        self.errors: dict[int, str] = {}
        self.released: set[int] = set()
        self.dead: set[int] = set()
        self.noop: set[int] = set()


class AckResults(Sequence[dict[str, Any]]):
    """One request's results (``ack`` answers one per item, in order, indexed from 0), kept as the
    call's verdicts instead of a dict per item: :meth:`body` renders the JSON answer straight to bytes
    (byte for byte what ``orjson.dumps`` of the dicts gives: tests/test_ack_bytes.py) and
    :meth:`applied` counts for the metrics; indexing or iterating builds the dicts (tests, callers)."""

    __slots__ = ("_rows", "_start", "_stop", "_v", "wake")

    def __init__(self, verdicts: _Verdicts | None, start: int, stop: int,
                 rows: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self._v = verdicts
        self._start = start
        self._stop = stop
        self._rows = rows  # the dicts themselves (the ack_v1/ack_v2 rows path)
        # the queues in which the call left a cursor row claimable (queen._ack_wakes): the route wakes the
        # pops parked there, as after a push. Fused requests: on every request's results (a wake is cheap;
        # the first request's client may have gone, and then its route wakes nobody).
        self.wake: Sequence[str] = ()

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> AckResults:
        return cls(None, 0, len(rows), rows)

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, k: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, k: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, k: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        if self._rows is not None:
            return self._rows[k]
        v = self._v
        assert v is not None
        i = self._start + k
        error = v.errors.get(i)
        return {
            "index": k,
            "transactionId": v.items[i].transaction_id,
            "success": error is None,
            "error": error,
            "leaseReleased": i in v.released,
            "dlq": i in v.dead,
            "noop": i in v.noop,
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[k] for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AckResults | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AckResults({list(self)!r})"

    def body(self) -> bytes:
        """The JSON answer: ``orjson.dumps(list(self))``, without the dicts (an item with a verdict, such
        as the last one of a lease, which released it, is rendered from its dict)."""
        if self._rows is not None:
            return _dumps(self._rows)
        if not len(self):
            return b"[]"
        v = self._v
        assert v is not None
        items, lo, hi = v.items, self._start, self._stop
        marked = {i for c in (v.errors, v.released, v.dead, v.noop) for i in c if lo <= i < hi}
        ok = _RESULT_OK
        if not marked:
            parts = [ok % (k, _dumps(items[lo + k].transaction_id)) for k in range(hi - lo)]
        else:
            parts = [
                _dumps(self[k]) if lo + k in marked else ok % (k, _dumps(items[lo + k].transaction_id))
                for k in range(hi - lo)
            ]
        return b"[" + b",".join(parts) + b"]"

    def applied(self) -> dict[str, int] | None:
        """Acks that applied (not refused, not answered ``noop``), per status (``completed``, ...); None
        when the results are rows (the caller counts from the dicts)."""
        per: dict[str, int] = {}
        if self._rows is not None:
            return None
        v = self._v
        assert v is not None
        statuses = STATUSES
        errors, noop = v.errors, v.noop
        skip = bool(errors or noop)
        if not skip:  # counted without a Python frame per item
            for s, n in Counter(map(_STATUS, islice(v.items, self._start, self._stop))).items():
                s = statuses.get(s, s)
                per[s] = per.get(s, 0) + n
            return per
        for i in range(self._start, self._stop):
            if skip and (i in errors or i in noop):
                continue
            s = v.items[i].status
            s = statuses.get(s, s)
            per[s] = per.get(s, 0) + 1
        return per


def _lease_of(lease_id: str, parsed: dict[str, uuid.UUID | None]) -> uuid.UUID | None:
    """``lease_id`` as a UUID (None: not one); a batch's items share one lease: parsed once."""
    lease = parsed.get(lease_id, _UNPARSED)
    if lease is _UNPARSED:
        try:
            lease = parsed[lease_id] = uuid.UUID(lease_id)
        except ValueError:
            lease = parsed[lease_id] = None
    return lease


def _add_each(items: Sequence[AckLike], which: range, pack: Packed, sent: list[int],
              parsed: dict[str, uuid.UUID | None], v: _Verdicts) -> None:  # fmt: skip
    """Items ``which`` into ``pack`` one by one; a refused one gets its verdict in ``v`` instead."""
    last_pid: str | int | None = None
    pid = -1
    for i in which:
        item = items[i]
        raw_pid = item.partition_id
        if raw_pid != last_pid:  # a batch's items share one partition: parsed once
            try:
                pid = int(raw_pid)
            except ValueError:
                pid = -1
            last_pid = raw_pid if 0 <= pid <= BIGINT_MAX else None
        if not 0 <= pid <= BIGINT_MAX:
            v.errors[i] = f"unknown partitionId {raw_pid!r}"
            continue
        lease: uuid.UUID | None = None
        if item.lease_id:
            lease = _lease_of(item.lease_id, parsed)
            if lease is None:
                v.errors[i] = "lease is not held (unknown leaseId)"
                continue
        sent.append(i)
        pack.add(pid, item.transaction_id, lease, item.group or QUEUE_MODE, STATUSES[item.status], item.error)




def _add_kind(req: Sequence[AckLike], at: int, pack: Packed, sent: list[int],
              parsed: dict[str, uuid.UUID | None]) -> bool:  # fmt: skip
    """One request's items into ``pack`` at once when they are all of one kind (partition, lease,
    group, status; no error text) and none is refused: the usual batch, the same as :func:`_add_each`
    without its work per item. False (nothing added) otherwise."""
    if len(req) < 2 or len(set(map(_KIND, req))) != 1:
        return False
    first = req[0]
    if first.error is not None:
        return False
    try:
        pid = int(first.partition_id)
    except ValueError:
        return False
    if not 0 <= pid <= BIGINT_MAX:
        return False
    lease: uuid.UUID | None = None
    if first.lease_id:
        lease = _lease_of(first.lease_id, parsed)
        if lease is None:
            return False
    sent += range(at, at + len(req))
    pack.add_kind(pid, [it.transaction_id for it in req], lease, first.group or QUEUE_MODE, STATUSES[first.status])
    return True


async def ack_many(
    db: Database, tenant: str, requests: Sequence[Sequence[AckLike]], once: Once | None = None
) -> list[AckResults]:
    """Settle several requests' items in ONE ``queen.ack_v3`` call (request fusion); each request
    gets its own results, in its order, indexed from 0. The fuser only combines requests whose
    :func:`cursor_keys` are disjoint, so the call equals running them one after the other. ``once``
    (one request only, never fused) calls ``queen.ack_v2`` instead."""
    items = [it for req in requests for it in req] if len(requests) != 1 else requests[0]
    v = _Verdicts(items)
    sent: list[int] = []
    pack = Packed()
    parsed: dict[str, uuid.UUID | None] = {}
    first = 0  # the request's first item in ``items``
    for req in requests:
        if not _add_kind(req, first, pack, sent, parsed):
            _add_each(items, range(first, first + len(req)), pack, sent, parsed, v)
        first += len(req)
    wake: Sequence[str] = ()
    if sent and once is None and pack.packable:
        book = book_of(db)
        hint = pack.hint(book, cache_of(db))
        refused, errors, released, dead, noop, wake = (await db.fetch(ACK_SQL, tenant, *pack.args(), hint))[0]
        if hint is not None:
            pack.settled(book)
        at = sent.__getitem__  # 1-based position among the sent items -> the call's item index
        for n, error in zip(refused, errors, strict=True):
            v.errors[at(n - 1)] = error
        v.released.update(at(n - 1) for n in released)
        v.dead.update(at(n - 1) for n in dead)
        v.noop.update(at(n - 1) for n in noop)
    elif sent:
        if once is None:  # a batch naming more (partition, group, lease, status) kinds than ack_v3 holds
            rows = await db.fetch(ACK_ROWS_SQL, tenant, *pack.arrays())
        else:
            rows = await db.fetch(ACK_ONCE_SQL, tenant, *pack.arrays(), *once.args())
            once.replayed = bool(rows) and rows[0]["replayed"]
        if once is None or not once.replayed:
            wake = await _wakes(db, tenant, pack)
        got: dict[int, dict[str, Any]] = {}
        for row in rows:
            i = sent[row["idx"] - 1]
            got[i] = {
                "index": i,
                "transactionId": items[i].transaction_id,
                "success": row["success"],
                "error": row["error"],
                "leaseReleased": row["lease_released"],
                "dlq": row["dlq"],
                "noop": row["noop"],
            }
        out_rows: list[AckResults] = []
        start = 0
        for req in requests:
            part = []
            for i in range(start, start + len(req)):
                r = got.get(i)
                if r is None and i in v.errors:
                    r = _refused(i, items[i], v.errors[i])
                if r is not None:
                    part.append(r | {"index": r["index"] - start})
            out_rows.append(AckResults.of(part))
            start += len(req)
        return _waking(out_rows, wake)
    out: list[AckResults] = []
    start = 0
    for req in requests:
        out.append(AckResults(v, start, start + len(req)))
        start += len(req)
    return _waking(out, wake)


def _waking(results: list[AckResults], wake: Sequence[str]) -> list[AckResults]:
    """Every member's results carry the call's wake: the first one's client may have gone (its route
    then wakes nobody)."""
    for res in results:
        res.wake = wake
    return results


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
