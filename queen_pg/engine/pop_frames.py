"""The framed pop answer (docs/wire.md#framed-pop, ``frames=true``): QPF1, shipping stored segment blobs as they are.

    "QPF1" | u8 version (0, or 1 = a JSON head follows) | [u32 len | JSON object of extra keys]
    u16 len+queue | u16 len+leaseId | u16 len+consumerGroup | u32 claims
    per claim:  u64 partitionId | u16 len+partition | u64 start | u64 end (inclusive) | u32 deliveryAttempt
                | u32 records
    per record: u64 base_offset | i64 created_at_us | u32 count | u8 codec (0 raw, 1 zstd) | u32 len | bytes

A segment is stored as exactly such a record's bytes (``codec.py``), so a segment the lease covers
whole goes out as it is: not decompressed, not decoded, not compressed again. A segment is cut instead
(the delivered frames' bytes go out raw, codec 0, one record per run of consecutive offsets, each run
one slice of the decompressed segment, which comes from the segment cache of ``pop_render.py``: the
pops cutting one segment, and the acks of their leases, decompress and walk it once) only where it
must be: the lease covers part of it, it holds frames a push dropped as
duplicates (they have no offset, and a record's frame i is offset base+i), the group passes over some
of its offsets (``acked``: settled out of order), or :func:`needs_rewrite` says its frames must be
rewritten (then each frame is decoded with ``codec.unpack`` and framed again). One pop claim with a
redelivered part and a fresh part is two claims of the same partition, since a claim has one
deliveryAttempt (the head then says ``partitionsClaimed``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

import orjson

from queen_pg.db.pool import Record
from queen_pg.engine import codec
from queen_pg.engine.pop_render import NO_CACHE, RenderedPop, SegmentCache

MAGIC = b"QPF1"
CONTENT_TYPE = "application/x-queen-pop"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_CLAIM_HEAD = struct.Struct("<Q")  # partitionId, then the partition name
_CLAIM_TAIL = struct.Struct("<QQII")
_RECORD = struct.Struct("<QqIBI")


def needs_rewrite(row: Record) -> bool:
    """THE hook for per-segment rewriting on a framed pop: True when a segment's stored frames may not
    reach the client as stored (encrypted payloads: the client refuses frame flag 4, so they are
    decrypted and framed again through ``codec.unpack``). Nothing needs it today."""
    return False


def _text(value: str) -> bytes:
    raw = value.encode()
    return _U16.pack(len(raw)) + raw


def _rewritten(row: Record) -> list[bytes]:
    """Every live frame of a segment that :func:`needs_rewrite`, decoded and framed again."""
    return [
        codec.encode_frame(f.message_id, f.transaction_id, f.payload, f.trace_id, f.producer_sub)
        for f in codec.unpack(row["payload"], row["codec"])
    ]


def _records(row: Record, lo: int, hi: int, created_us: int, cache: SegmentCache) -> tuple[list[bytes], int]:
    """The records delivering offsets [lo, hi) of one segment, and how many messages they hold."""
    base, seg_end = row["base_offset"], row["end_offset"]
    first, last = max(lo, base), min(hi, seg_end)
    if first >= last:
        return [], 0
    passed = {o for o in (row["acked"] or ()) if first <= o < last}
    rewrite = needs_rewrite(row)
    if first == base and last == seg_end and not passed and not row["dropped"] and not rewrite:
        blob = row["payload"]
        return [_RECORD.pack(base, created_us, seg_end - base, row["codec"], len(blob)), blob], seg_end - base
    # cut: the live frames of each run of delivered offsets, as one raw record (the decompressed
    # segment and its frame boundaries come from the segment cache: one walk for all the pops cutting it)
    span: Callable[[int, int], bytes]
    if rewrite:
        frames = _rewritten(row)
        span = lambda k0, k1: b"".join(frames[k0:k1])  # noqa: E731
    else:
        span = cache.segment(row)[0].span
    runs: list[tuple[int, int]] = []
    if not passed:
        runs.append((first, last))
    else:
        run_base = None
        for off in range(first, last):
            if off in passed:
                if run_base is not None:
                    runs.append((run_base, off))
                    run_base = None
            elif run_base is None:
                run_base = off
        if run_base is not None:
            runs.append((run_base, last))
    out: list[bytes] = []
    n = 0
    for a, b in runs:
        data = span(a - base, b - base)
        out.extend((_RECORD.pack(a, created_us, b - a, codec.CODEC_RAW, len(data)), data))
        n += b - a
    return out, n


def render_frames(
    queue_mode: bool,
    lease: str,
    group: str,
    autopilot: bool,
    rows: Sequence[Record],
    cache: SegmentCache = NO_CACHE,
) -> RenderedPop | None:
    """The QPF1 answer for pop_v1's rows (``pop.render``'s twin); None when nothing is delivered.
    ``cache`` holds the decompressed segments a cut needs (never pass it rows holding opened plaintext)."""
    parts: list[bytes] = []
    claims = 0
    total = 0
    partitions = 0
    first_queue = ""
    claimed: list[tuple[str, str, int]] = []
    for pid, prows_it in groupby(rows, key=_pid):
        prows = list(prows_it)
        r0 = prows[0]
        start, end, redo = r0["lease_start"], r0["lease_end"], r0["redelivered_end"]
        spans = [(start, min(end, redo), r0["attempts"]), (max(start, redo), end, 1)]
        got = 0
        for lo, hi, attempt in spans:
            if lo >= hi:
                continue
            records: list[bytes] = []
            n = 0
            for row in prows:
                recs, k = _records(row, lo, hi, (row["created_at"] - _EPOCH) // _US, cache)
                records.extend(recs)
                n += k
            if n == 0:
                continue
            parts.append(_CLAIM_HEAD.pack(pid))
            parts.append(_text(r0["partition_name"]))
            parts.append(_CLAIM_TAIL.pack(lo, hi - 1, attempt, len(records) // 2))
            parts.extend(records)
            claims += 1
            got += n
        if got:
            partitions += 1
            total += got
            first_queue = first_queue or r0["queue_name"]
            claimed.append((r0["queue_name"], str(pid), got))
    if not total:
        return None
    head: dict[str, Any] = {}
    if queue_mode:
        head["consumerGroup"] = None  # as the JSON answer says it
    if claims != partitions:
        head["partitionsClaimed"] = partitions
    if autopilot:
        head["autopilot"] = {"partitions": partitions, "batch": total, "waitMs": 0}
    out = [MAGIC]
    if head:
        js = orjson.dumps(head)
        out += [b"\x01", _U32.pack(len(js)), js]
    else:
        out.append(b"\x00")
    out += [_text(first_queue), _text(lease), _text(group), _U32.pack(claims), *parts]
    return RenderedPop(b"".join(out), total, claimed, CONTENT_TYPE)


_pid: Callable[[Record], int] = lambda row: row["partition_id"]  # noqa: E731
