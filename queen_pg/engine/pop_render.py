"""The JSON pop answer (docs/wire.md#pop), rendered straight to bytes, and the segment cache fan-out shares.

A pop_v1 row carries one stored segment (``codec.py``: a zstd frame of QPF1 frames). Rendering a
message is JSON text from byte pieces, not a dict per message handed to a serializer:

    head(frame) + claim(pop, partition) + payload(frame) + createdAt(segment) + tail(frame)
    + attempt(pop, redelivered or not) + offset + "}"

``head`` (``{"id":…,"transactionId":…,``) and ``tail`` (``,"traceId":…,"producerSub":…,
"deliveryAttempt":``) are the same for every group that reads the frame; ``claim``
(partitionId, partition, queue, leaseId, consumerGroup, ``"data":``) and ``attempt`` are built once
per pop. The key order is the one the dict rendering had (test_pop_render.py holds them equal).

Only the leased frames are rendered: a segment is decompressed whole (zstd cannot do less), its
frame boundaries are walked (a u32 read per frame), and a frame is decoded the first time a pop
delivers it.

:class:`SegmentCache` keeps decoded segments, LRU, bounded by bytes (an estimate: the decompressed
segment, plus each rendered frame's pieces as they are made), so groups reading the same segments
(fan-out) decompress and decode each once. A segment row never changes once inserted (push_v1 and
the DLQ requeue insert whole segments; only retention and clear delete; offsets are never reused),
and the key is its identity plus a hash of the stored blob: ``(partition_id, base_offset,
end_offset, codec, len, xxh3_64(blob))``, so even a database rewound under a running broker cannot
serve a stale entry. Encrypted queues: a sealed frame's payload stays in the cache as stored
(ciphertext) and is opened per pop, never cached in plaintext (``crypto.opened``).
"""

from __future__ import annotations

import struct
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import xxhash

from queen_pg.db.pool import Record
from queen_pg.db.types import fast_uuid
from queen_pg.engine import codec
from queen_pg.security import crypto

_HEAD = struct.Struct("<IB")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HEAD_FMT = b'{"id":"%s","transactionId":%s,'
_TAIL_FMT = b',"traceId":%s,"producerSub":%s,"deliveryAttempt":'
_TAIL_NO_SUB = _TAIL_FMT % (b"null", b"null")  # shared by every frame without trace id and producer
FRAME_OVERHEAD = 200  # bytes charged per rendered frame beyond its payload (pieces, tuple, list slot)
ENTRY_OVERHEAD = 300  # bytes charged per cached segment (key, entry, list)
TXN_OVERHEAD = 64  # bytes charged per transactionId read for the lease book beyond its text (str, list slot)


@dataclass(slots=True)
class RenderedPop:
    """A pop answer, JSON or framed (``pop_frames.py``): the bytes, their media type, and what the metrics
    count (queue, partitionId, messages)."""

    body: bytes
    messages: int
    claimed: list[tuple[str, str, int]] = field(default_factory=list)
    media_type: str = "application/json"


def iso_ms(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


# (head, payload, sealed, tail) of one frame; see the module docstring
Piece = tuple[bytes, bytes, bool, bytes]


class Segment:
    """One stored segment, decompressed; its live frames (dropped ones left out) decoded on demand.
    Also serves the framed pop (:meth:`span`: a cut segment's frames as stored) and the lease book
    (:meth:`transaction_ids`), so a segment that several pops and acks cut is walked once."""

    __slots__ = ("contiguous", "cost", "pieces", "raw", "starts", "txns")

    def __init__(self, blob: bytes, codec_id: int, dropped: Sequence[int] | None) -> None:
        raw = codec._decompressor.decompress(blob) if codec_id == codec.CODEC_ZSTD else bytes(blob)
        skip = set(dropped or ())
        starts: list[int] = []
        at, end, i = 0, len(raw), 0
        while at < end:
            (body_len,) = _U32.unpack_from(raw, at)
            if i not in skip:
                starts.append(at)
            at += 4 + body_len
            i += 1
        self.txns: list[str] | None = None  # read by transaction_ids(), the first time it is asked
        self.raw = raw
        self.starts = starts  # byte offset of live frame k (offset base_offset + k)
        self.contiguous = not skip  # live frames k..j are one run of bytes (no dropped frame between)
        self.pieces: list[Piece | None] = [None] * len(starts)
        self.cost = len(raw) + ENTRY_OVERHEAD

    def span(self, k0: int, k1: int) -> bytes:
        """Live frames k0..k1-1 as stored, one after another (a framed pop's cut record)."""
        raw, starts = self.raw, self.starts
        if self.contiguous:
            return raw[starts[k0] : starts[k1] if k1 < len(starts) else len(raw)]
        unpack = _U32.unpack_from
        return b"".join([raw[at : at + 4 + unpack(raw, at)[0]] for at in starts[k0:k1]])

    def transaction_ids(self) -> tuple[list[str], int]:
        """Live frame k's transactionId at k (read once per segment), and the bytes that added to this
        entry (0 when read before)."""
        txns = self.txns
        if txns is not None:
            return txns, 0
        raw = self.raw
        trace = codec.FLAG_TRACE
        txns = []
        append = txns.append
        for at in self.starts:
            pos = at + (37 if raw[at + 4] & trace else 21)  # u32 length, u8 flags, 16-byte id[, trace id]
            end = pos + 2 + (raw[pos] | raw[pos + 1] << 8)
            append(raw[pos + 2 : end].decode())
        self.txns = txns
        added = _txn_cost(txns)
        self.cost += added
        return txns, added

    def piece(self, k: int) -> tuple[Piece, int]:
        """Live frame k's pieces, and the bytes it added to this entry (0 when decoded before)."""
        got = self.pieces[k]
        if got is not None:
            return got, 0
        raw = self.raw
        at = self.starts[k]
        body_len, flags = _HEAD.unpack_from(raw, at)
        stop = at + 4 + body_len
        pos = at + 21
        mid = str(fast_uuid(raw[at + 5 : pos])).encode()
        trace = b"null"
        if flags & codec.FLAG_TRACE:
            trace = b'"' + str(fast_uuid(raw[pos : pos + 16])).encode() + b'"'
            pos += 16
        end = pos + 2 + (raw[pos] | raw[pos + 1] << 8)  # u16 length, then the transactionId
        head = _HEAD_FMT % (mid, orjson.dumps(raw[pos + 2 : end].decode()))
        pos = end
        if flags & codec.FLAG_SUB:
            (slen,) = _U16.unpack_from(raw, pos)
            pos += 2
            sub = orjson.dumps(raw[pos : pos + slen].decode(errors="replace"))
            pos += slen
            tail = _TAIL_FMT % (trace, sub)
        else:
            tail = _TAIL_NO_SUB if trace == b"null" else _TAIL_FMT % (trace, b"null")
        got = (head, raw[pos:stop], bool(flags & codec.FLAG_SEALED), tail)
        self.pieces[k] = got
        added = len(head) + len(got[1]) + len(tail) + FRAME_OVERHEAD
        self.cost += added
        return got, added


def _txn_cost(txns: list[str]) -> int:
    return sum(map(len, txns)) + TXN_OVERHEAD * len(txns)


SegmentKey = tuple[int, int, int, int, int, int]


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class SegmentCache:
    """Decoded segments by identity, least recently used first out, at most ``max_bytes`` (estimated).
    ``max_bytes`` 0 = no caching (every pop decodes what it delivers)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = CacheStats()
        self._entries: OrderedDict[SegmentKey, Segment] = OrderedDict()

    @property
    def entries(self) -> int:
        return len(self._entries)

    def segment(self, row: Record) -> tuple[Segment, SegmentKey | None]:
        """The row's decoded segment (cached, or decoded now and cached when it fits)."""
        blob = row["payload"]
        if self.max_bytes <= 0:
            return Segment(blob, row["codec"], row["dropped"]), None
        key = (row["partition_id"], row["base_offset"], row["end_offset"], row["codec"], len(blob),
               xxhash.xxh3_64_intdigest(blob))  # fmt: skip
        seg = self._entries.get(key)
        if seg is not None:
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return seg, key
        self.stats.misses += 1
        seg = Segment(blob, row["codec"], row["dropped"])
        if seg.cost > self.max_bytes:
            return seg, None
        self._entries[key] = seg
        self.bytes += seg.cost
        self._trim()
        return seg, key

    def grew(self, key: SegmentKey | None, added: int) -> None:
        """A cached segment decoded more frames (``added`` bytes)."""
        if key is not None and added and key in self._entries:
            self.bytes += added
            self._trim()

    def _trim(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.cost
            self.stats.evictions += 1


_CACHES: weakref.WeakKeyDictionary[Any, SegmentCache] = weakref.WeakKeyDictionary()
NO_CACHE = SegmentCache(0)  # caches nothing: every call decodes what it needs


def bind(db: object, cache: SegmentCache) -> None:
    """Give the database handle its segment cache (the app's lifespan does, from the settings)."""
    _CACHES[db] = cache


def cache_of(db: object) -> SegmentCache:
    """The segment cache of a database handle; one that caches nothing when none was bound."""
    return _CACHES.get(db, NO_CACHE)


@dataclass(frozen=True, slots=True)
class _Sealed:
    """A sealed payload as ``crypto.opened`` takes it."""

    payload: bytes
    sealed: bool = True


def _text(value: str | None) -> bytes:
    return orjson.dumps(value)


def render(
    rows: Sequence[Record],
    lease: str | None,
    group: str | None,
    autopilot: bool,
    cache: SegmentCache,
    vault: crypto.Vault | None = None,
    *,
    tenant: str,
) -> RenderedPop | None:
    """pop_v1's rows (of ``tenant``) as the JSON pop answer; None when nothing is delivered. ``lease``
    None = autoAck (each message says ``"leaseId": null``, the answer ``""``). Sealed payloads are
    opened with ``vault`` for the row's (tenant, queue, partition) (409 when it has no key for them or
    they were sealed elsewhere), per pop."""
    parts: list[bytes] = []
    claims: list[tuple[str, str, str]] = []  # (partitionId, partition, queue) in claim order
    claimed: list[tuple[str, str, int]] = []
    lease_json = _text(lease)
    group_json = _text(group)
    n = 0
    claim_part = b""
    last_pid: int | None = None
    place: crypto.Place | None = None  # the row's, made when a sealed frame of its partition is opened
    for row in rows:
        pid_int = row["partition_id"]
        if pid_int != last_pid or not claims:
            pid = str(pid_int)
            claims.append((pid, row["partition_name"], row["queue_name"]))
            claimed.append((row["queue_name"], pid, 0))
            claim_part = (b'"partitionId":"' + pid.encode() + b'","partition":' + _text(row["partition_name"])
                          + b',"queue":' + _text(row["queue_name"]) + b',"leaseId":' + lease_json
                          + b',"consumerGroup":' + group_json + b',"data":')  # fmt: skip
            last_pid = pid_int
            place = None
        start, end, redo = row["lease_start"], row["lease_end"], row["redelivered_end"]
        base, seg_end = row["base_offset"], row["end_offset"]
        first, last = max(start, base), min(end, seg_end)
        if first >= last:
            continue
        passed = row["acked"]
        skip = set(passed) if passed else ()
        attempts = row["attempts"]
        again = b'%d,"retryCount":%d,"offset":' % (attempts, attempts - 1)
        fresh = b'1,"retryCount":0,"offset":'
        created = b',"createdAt":"' + iso_ms(row["created_at"]).encode() + b'"'
        seg, key = cache.segment(row)
        pieces = seg.pieces
        added = 0
        got = 0
        for off in range(first, last):
            if off in skip:
                continue
            piece = pieces[off - base]
            if piece is None:
                piece, grown = seg.piece(off - base)
                added += grown
            head, payload, sealed, tail = piece
            if sealed:
                if place is None:
                    place = crypto.Place(tenant, row["queue_name"], row["partition_name"])
                payload = crypto.opened(vault, _Sealed(payload), place)
            # one message: the pieces as they stand, joined once with the whole answer below
            parts += (head, claim_part, payload, created, tail, again if off < redo else fresh, b"%d}," % off)
            got += 1
        cache.grew(key, added)
        if got:
            n += got
            q, p, k = claimed[-1]
            claimed[-1] = (q, p, k + got)
    if not n:
        return None
    first_claim = claims[0]
    out = (b'{"success":true,"queue":' + _text(first_claim[2]) + b',"partition":' + _text(first_claim[1])
           + b',"partitionId":"' + first_claim[0].encode() + b'","leaseId":' + _text(lease or "")
           + b',"consumerGroup":' + group_json + b',"partitionsClaimed":%d,"messages":[' % len(claims)
           + b"".join(parts)[:-1] + b"]")  # fmt: skip
    if autopilot:
        out += b',"autopilot":{"partitions":%d,"batch":%d,"waitMs":0}' % (len(claims), n)
    return RenderedPop(out + b"}", n, [c for c in claimed if c[2]])
