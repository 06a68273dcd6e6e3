"""What this process handed out under each lease, so that an ack of it needs no hash look-up.

A pop's rows (``queen.pop_v1``) say, per claimed partition, the leased range [lease_start, lease_end),
the offsets the group passes over (``acked``) and the segments holding it. :class:`LeaseBook` keeps
those rows per lease id (LRU, bounded by the bytes of the segment blobs they reference: the same bytes
the answer was made of). When an ack's items are all of one kind (one partition, group and lease,
``completed``: the usual batch), :meth:`LeaseBook.hint` reads the transactionIds of the leased frames
and returns ``(lease_start, lowest, highest)`` offset of the items, or None when any item is not among
them. ``queen.ack_v3`` takes it as ``p_hint`` and trusts it only while it can (sql/procedures/040_ack.sql:
the cursor inside the range, the lease live, no passed-over offsets); otherwise it looks the hashes up
as before. The hint saves PostgreSQL the one index descent per item into ``log_txns`` (random keys:
the largest part of an ack of 100 there).

The frames are read at ack time, not pop time, so a framed pop (segments shipped as stored) pays
nothing unless its lease is acked through this process; they are read through the segment cache
(``pop_render.py``), once per segment for all the leases and pops that share it. An ack reaching
another worker or broker has no hint and is settled the usual way.
"""

from __future__ import annotations

import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from queen_pg.db.pool import Record
from queen_pg.engine.pop_render import NO_CACHE, SegmentCache

MAX_BYTES = 8 << 20  # segment bytes referenced at most (the blobs are shared with the pop's rows)
MAX_LEASES = 1024
ENTRY_OVERHEAD = 400  # bytes charged per lease beyond its blobs


class _Claim:
    """One claimed partition of a lease: its range, passed-over offsets, segments; offsets by
    transactionId, read on the first ack."""

    __slots__ = ("end", "offsets", "passed", "rows", "start")

    def __init__(self, start: int, end: int, passed: Sequence[int] | None) -> None:
        self.start = start
        self.end = end
        self.passed = frozenset(passed or ())
        self.rows: list[Record] = []
        self.offsets: dict[str, int] | None = None

    def resolve(self, cache: SegmentCache) -> dict[str, int]:
        """transactionId -> its oldest offset in the leased range (dropped and passed-over frames left
        out). A segment's transactionIds are read once through ``cache`` (pop_render.py, shared with
        the pops that rendered or cut it): an ack then costs no decompression and no frame walk."""
        if self.offsets is not None:
            return self.offsets
        out: dict[str, int] = {}
        for row in self.rows:
            base = row["base_offset"]
            first, last = max(self.start, base), min(self.end, row["end_offset"])
            if first >= last:
                continue
            seg, key = cache.segment(row)
            txns, added = seg.transaction_ids()
            cache.grew(key, added)
            names: Sequence[str] = txns[first - base : last - base]
            offsets: Sequence[int] = range(first, first + len(names))
            if self.passed:
                kept = [(t, o) for t, o in zip(names, offsets, strict=True) if o not in self.passed]
                names, offsets = [t for t, _ in kept], [o for _, o in kept]
            # the oldest offset of a transactionId wins: it is assigned last (reversed), and rows come
            # in offset order, so what ``out`` holds already wins over this row's
            got = dict(zip(reversed(names), reversed(offsets), strict=True))
            if out:
                got.update(out)
            out = got
        self.offsets = out
        return out


class LeaseBook:
    """Leases this process handed out, newest last, at most ``max_bytes`` of segment blobs and
    ``max_leases`` leases (the oldest go first). ``max_bytes`` 0 keeps nothing."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_leases: int = MAX_LEASES) -> None:
        self.max_bytes = max_bytes
        self.max_leases = max_leases
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._leases: OrderedDict[uuid.UUID, tuple[dict[int, _Claim], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._leases)

    def remember(self, lease: uuid.UUID, rows: Sequence[Record]) -> None:
        """A pop leased ``rows`` (queen.pop_v1's, in claim order) under ``lease``."""
        if self.max_bytes <= 0 or not rows:
            return
        claims: dict[int, _Claim] = {}
        size = ENTRY_OVERHEAD
        for row in rows:
            pid = row["partition_id"]
            claim = claims.get(pid)
            if claim is None:
                claim = claims[pid] = _Claim(row["lease_start"], row["lease_end"], row["acked"])
            claim.rows.append(row)
            size += len(row["payload"])
        if size > self.max_bytes:
            return
        self.forget(lease)
        self._leases[lease] = (claims, size)
        self.bytes += size
        while self._leases and (self.bytes > self.max_bytes or len(self._leases) > self.max_leases):
            _, (_, old) = self._leases.popitem(last=False)
            self.bytes -= old

    def forget(self, lease: uuid.UUID) -> None:
        got = self._leases.pop(lease, None)
        if got is not None:
            self.bytes -= got[1]

    def settled(self, lease: uuid.UUID, pid: int) -> None:
        """An ack of the lease's part on ``pid`` used the book: that part is forgotten (a lease is acked
        once as a rule; a later ack of it is looked up in PostgreSQL); the lease goes with its last part."""
        got = self._leases.get(lease)
        if got is None or got[0].pop(pid, None) is None or got[0]:
            return
        self.forget(lease)

    def hint(
        self, lease: uuid.UUID, pid: int, transaction_ids: Sequence[str], cache: SegmentCache = NO_CACHE
    ) -> list[int] | None:
        """``[lease_start, lowest, highest]`` offset of the items in the partition's leased range, or
        None when the lease or partition is not known here or an item is not among its frames
        (``cache``: the decoded segments, pop_render.py)."""
        got = self._leases.get(lease)
        claim = got[0].get(pid) if got is not None else None
        if claim is None or not transaction_ids:
            self.misses += 1
            return None
        offsets = claim.resolve(cache)
        try:
            found = [offsets[t] for t in transaction_ids]
        except KeyError:
            self.misses += 1
            return None
        self.hits += 1
        return [claim.start, min(found), max(found)]


_BOOKS: weakref.WeakKeyDictionary[Any, LeaseBook] = weakref.WeakKeyDictionary()


def book_of(db: object) -> LeaseBook:
    """The lease book of a database handle (one per process and database; made on first use)."""
    book = _BOOKS.get(db)
    if book is None:
        book = _BOOKS[db] = LeaseBook()
    return book
