"""The ack's arguments packed for ``queen.ack_v3`` (:class:`Packed`): one bytea of fixed-size items,
the few distinct (partition, group, lease, status) kinds as arrays, the transactionIds as one UTF-8
text, the lease book's hint (queen_pg/engine/leases.py); the same items as ``queen.ack_v1``'s parallel
arrays when ack_v3 cannot take them. No database call here: ``ack.py`` makes it."""

from __future__ import annotations

import struct
import uuid
from itertools import accumulate
from typing import Any

import xxhash

from queen_pg.db.types import fast_uuid
from queen_pg.engine.leases import LeaseBook
from queen_pg.engine.pop_render import NO_CACHE, SegmentCache

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
