"""Ack: settle delivered messages through one call to ``queen.ack_v3`` (or, under a request key,
``queen.ack_v2``: the outcome window, queen_pg/engine/outcomes.py). An ack is an offset commit
(docs/wire.md#ack-offset-commit, the rules in sql/procedures/040_ack.sql): completing offset N commits the group's
cursor through N, a nack clamps it, and each item's answer says whether it moved it (``noop``)."""

from __future__ import annotations

import logging
import operator
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime
from itertools import islice
from typing import Any, Protocol, overload

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.engine.ack_pack import Packed
from queen_pg.engine.leases import book_of
from queen_pg.engine.outcomes import Once
from queen_pg.engine.pop import QUEUE_MODE, iso_ms
from queen_pg.engine.pop_render import cache_of
from queen_pg.errors import QueenError

log = logging.getLogger("queen_pg.ack")

STATUSES = {"completed": "completed", "success": "completed", "failed": "failed", "retry": "retry", "dlq": "dlq"}


class AckLike(Protocol):
    """An item to settle, as the engine reads it: the ack route's decoded body item (settled as
    decoded, no copy: ``queen_pg.api.shared.items.AckItem``, the one ack item type)."""

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


async def _wakes(db: Database, tenant: str, pack: Packed) -> Sequence[str]:
    """``queen._ack_wakes`` after an ack_v1/ack_v2 call, which committed: a wake is a hint, so a
    failed look-up answers none (the parked pops' re-check covers it) rather than turning the committed
    ack into an error."""
    try:
        got: Sequence[str] = await db.fetchval(calls.ACK_WAKES, tenant, *pack.rows())
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
        refused, errors, released, dead, noop, wake = (await db.fetch(calls.ACK, tenant, *pack.args(), hint))[0]
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
            rows = await db.fetch(calls.ACK_ROWS, tenant, *pack.arrays())
        else:
            rows = await db.fetch(calls.ACK_ONCE, tenant, *pack.arrays(), *once.args())
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
        rows = await db.fetch(calls.LEASE_EXTEND, tenant, lid)
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
