"""The load generator's binary wire (docs/wire.md), doing per request what the official client does with
``binary_push=True, push_compression=True`` (frame every message with a fresh version-7 id, compress the
group once at zstd level 1) and with ``framed_pop=True`` (decompress each record, walk its frames). Only
the standard library, orjson and zstandard."""

from __future__ import annotations

import os
import struct
import time
from typing import Any

import orjson
import zstandard

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FRAME_HEAD = struct.Struct("<IB")
_CLAIM_TAIL = struct.Struct("<QQII")
_RECORD = struct.Struct("<QqIBI")
_compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
_decompressor = zstandard.ZstdDecompressor()
_payloads: dict[int, bytes] = {}


def _payload(size: int) -> bytes:
    p = _payloads.get(size)
    if p is None:
        base = b'{"kind":"bench","n":0,"text":""}'
        p = _payloads[size] = base[:-2] + b"x" * max(0, size - len(base)) + b'"}'
    return p


def binary_push_request(spec: dict[str, Any], cid: int, seq: int, part: int) -> bytes:
    """One QPB1 flag-8 push request: ``items`` frames to partition ``p<part>``, compressed here."""
    items, tag = spec["items"], spec["tag"]
    payload = _payload(spec.get("payload_bytes", 128))
    stamp = (time.time_ns() // 1_000_000).to_bytes(6, "big")
    noise = os.urandom(10 * items)
    frames = bytearray()
    for i in range(items):
        tail = bytearray(noise[10 * i : 10 * i + 10])
        tail[0] = 0x70 | (tail[0] & 0x0F)
        tail[2] = 0x80 | (tail[2] & 0x3F)
        txn = b"%s-%04d-%010d-%04d" % (tag.encode(), cid, seq, i)
        frames += _FRAME_HEAD.pack(1 + 16 + 2 + len(txn) + len(payload), 0)
        frames += stamp + tail
        frames += _U16.pack(len(txn)) + txn + payload
    z = _compressor.compress(bytes(frames))
    q, p = spec["queue"].encode(), b"p%05d" % part
    body = b"".join(
        (b"QPB1\x08", _U32.pack(1), _U16.pack(len(q)), q, _U16.pack(len(p)), p, _U32.pack(items), _U32.pack(len(z)), z)
    )
    head = b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-queen-push\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def ack_body_of_frames(data: bytes) -> tuple[int, bytes]:
    """A QPF1 pop answer -> (messages delivered, the ``acknowledgments`` JSON array for them)."""
    if data[:4] != b"QPF1":
        raise ValueError(f"not a framed pop answer: {data[:40]!r}")
    at = 5
    if data[4] == 1:
        (n,) = _U32.unpack_from(data, at)
        at += 4 + n

    def text(at: int) -> tuple[str, int]:
        (n,) = _U16.unpack_from(data, at)
        return data[at + 2 : at + 2 + n].decode(), at + 2 + n

    _queue, at = text(at)
    lease, at = text(at)
    _group, at = text(at)
    (claims,) = _U32.unpack_from(data, at)
    at += 4
    acks: list[dict[str, str]] = []
    for _ in range(claims):
        pid = str(struct.unpack_from("<Q", data, at)[0])
        _part, at = text(at + 8)
        start, end, _attempt, records = _CLAIM_TAIL.unpack_from(data, at)
        at += _CLAIM_TAIL.size
        for _r in range(records):
            base, _created, count, codec, length = _RECORD.unpack_from(data, at)
            at += _RECORD.size
            raw = data[at : at + length]
            at += length
            if codec == 1:
                raw = _decompressor.decompress(raw)
            pos = 0
            for i in range(count):
                body_len, flags = _FRAME_HEAD.unpack_from(raw, pos)
                p = pos + 21 + (16 if flags & 1 else 0)
                (tlen,) = _U16.unpack_from(raw, p)
                if start <= base + i <= end:
                    acks.append(
                        {"transactionId": raw[p + 2 : p + 2 + tlen].decode(), "partitionId": pid, "leaseId": lease}
                    )
                pos += 4 + body_len
    return len(acks), orjson.dumps(acks)
