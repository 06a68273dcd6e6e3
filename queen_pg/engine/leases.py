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
nothing unless its lease is acked through this process. An ack reaching another worker or broker has
no hint and is settled the usual way.
"""

from __future__ import annotations

import struct
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from queen_pg.db.pool import Record
from queen_pg.engine import codec

_HEAD = struct.Struct("<IB")
_U16 = struct.Struct("<H")
MAX_BYTES = 8 << 20  # segment bytes referenced at most (the blobs are shared with the pop's rows)
MAX_LEASES = 1024
ENTRY_OVERHEAD = 400  # bytes charged per lease beyond its blobs


def _whole(raw: bytes, base: int, out: dict[str, int]) -> None:
    """:meth:`_Claim.resolve` for a segment whose frames are all live and leased (no checks per frame)."""
    unpack = _HEAD.unpack_from
    trace = codec.FLAG_TRACE
    setdefault = out.setdefault  # frames in offset order: the first is the oldest
    at, stop, off = 0, len(raw), base
    while at < stop:
        body_len, flags = unpack(raw, at)
        pos = at + (37 if flags & trace else 21)  # u32 length, u8 flags, 16-byte id[, 16-byte trace id]
        end = pos + 2 + (raw[pos] | raw[pos + 1] << 8)
        setdefault(raw[pos + 2 : end].decode(), off)
        off += 1
        at += 4 + body_len


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

    def resolve(self) -> dict[str, int]:
        """transactionId -> its oldest offset in the leased range (dropped and passed-over frames left out)."""
        if self.offsets is not None:
            return self.offsets
        out: dict[str, int] = {}
        for row in self.rows:
            base, seg_end = row["base_offset"], row["end_offset"]
            if base >= self.end or seg_end <= self.start:
                continue
            blob = row["payload"]
            raw = codec._decompressor.decompress(blob) if row["codec"] == codec.CODEC_ZSTD else bytes(blob)
            if not row["dropped"] and not self.passed and self.start <= base and seg_end <= self.end:
                _whole(raw, base, out)  # the usual segment: every frame live and leased
                continue
            dropped = set(row["dropped"] or ())
            at, stop, i, off = 0, len(raw), 0, base
            while at < stop:
                body_len, flags = _HEAD.unpack_from(raw, at)
                nxt = at + 4 + body_len
                if i not in dropped:
                    if self.start <= off < self.end and off not in self.passed:
                        pos = at + 21 + (16 if flags & codec.FLAG_TRACE else 0)
                        (tlen,) = _U16.unpack_from(raw, pos)
                        txn = raw[pos + 2 : pos + 2 + tlen].decode()
                        if txn not in out:  # frames in offset order: the first is the oldest
                            out[txn] = off
                    off += 1
                at = nxt
                i += 1
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

    def hint(self, lease: uuid.UUID, pid: int, transaction_ids: Sequence[str]) -> list[int] | None:
        """``[lease_start, lowest, highest]`` offset of the items in the partition's leased range, or
        None when the lease or partition is not known here or an item is not among its frames."""
        got = self._leases.get(lease)
        claim = got[0].get(pid) if got is not None else None
        if claim is None or not transaction_ids:
            self.misses += 1
            return None
        offsets = claim.resolve()
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
