"""Message frames and segment blobs.

A segment blob is one zstd frame holding the appended messages as QPF1 frames (docs/wire.md#framed-pop):
``u32 body_len | u8 flags | u8[16] message id | [u8[16] trace id, flag 1] | u16 len, transactionId
| [u16 len, producerSub, flag 2] | payload JSON`` (little-endian). The producerSub is the pushing
token's ``sub`` (JWT on, queen_pg/security/); frames without flag 2 have none. Flag 4: the payload is
sealed (an encrypted queue, queen_pg/security/crypto.py), not JSON; readers open it before use. Storing the wire
format means a framed pop can later ship stored blobs as they are.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash
import zstandard

from queen_pg.db.types import fast_uuid

FLAG_TRACE = 1
FLAG_SUB = 2
FLAG_SEALED = 4
_HEAD = struct.Struct("<IB")
_U16 = struct.Struct("<H")

_compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
_decompressor = zstandard.ZstdDecompressor()  # the event loop's (pops): never used from another thread
_local = threading.local()


def dctx() -> zstandard.ZstdDecompressor:
    """This thread's decompressor, for code that may run in a worker thread (one decompressor is not
    safe to share between threads; making one costs ~30 µs)."""
    d: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


_V7_KEEP = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)  # every bit but the version and variant
_V7_SET = (0x7 << 76) | (0x2 << 62)  # version 7, RFC 4122 variant


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): 48-bit unix ms, then random bits (one int, ~1 µs:
    minted per pushed message)."""
    v = ((time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF) << 80 | int.from_bytes(os.urandom(10), "big")) & _V7_KEEP
    return fast_uuid((v | _V7_SET).to_bytes(16, "big"))


_VERSION7 = bytes(0x70 | (x & 0x0F) for x in range(256))  # byte 6: version 7 in the high nibble
_VARIANT = bytes(0x80 | (x & 0x3F) for x in range(256))  # byte 8: the RFC 4122 variant bits


def uuid7_blob(n: int) -> bytes:
    """``n`` version-7 ids (laid out as :func:`uuid7` mints one) as 16 × n bytes, from ONE clock
    read and ONE ``os.urandom`` call, stamped and masked a column at a time (a push mints an id per
    message: one syscall per message was ~10 % of the broker's push CPU). The ids share the
    millisecond, so their order within the blob is random, as that of ids minted one by one within a
    millisecond is; across calls they are ordered by the millisecond."""
    if n <= 0:
        return b""
    out = bytearray(os.urandom(16 * n))
    stamp = (time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF).to_bytes(6, "big")
    for j in range(6):
        out[j::16] = stamp[j : j + 1] * n
    out[6::16] = out[6::16].translate(_VERSION7)
    out[8::16] = out[8::16].translate(_VARIANT)
    return bytes(out)


def uuid7_many(n: int) -> list[uuid.UUID]:
    """``n`` version-7 ids minted at once (:func:`uuid7_blob`)."""
    blob = uuid7_blob(n)
    return [fast_uuid(blob[i : i + 16]) for i in range(0, len(blob), 16)]


def txn_hash(transaction_id: str) -> uuid.UUID:
    """xxh3-128 of a transactionId, as the 16-byte uuid stored in log_txns."""
    return fast_uuid(xxhash.xxh3_128_digest(transaction_id.encode()))


def txn_hashes(encoded: list[bytes]) -> bytes:
    """:func:`txn_hash` of each UTF-8 transactionId, as 16 × n bytes (push_v3's ``hashes``)."""
    digest = xxhash.xxh3_128_digest
    return b"".join([digest(t) for t in encoded])


def encode_frame(
    message_id: uuid.UUID,
    transaction_id: str,
    payload: bytes,
    trace_id: uuid.UUID | None,
    producer_sub: str | None = None,
    sealed: bool = False,
) -> bytes:
    txn = transaction_id.encode()
    flags = (FLAG_TRACE if trace_id is not None else 0) | (FLAG_SEALED if sealed else 0)
    parts = [message_id.bytes]
    if trace_id is not None:
        parts.append(trace_id.bytes)
    parts.append(_U16.pack(len(txn)))
    parts.append(txn)
    if producer_sub is not None:
        sub = producer_sub.encode()[:0xFFFF]
        flags |= FLAG_SUB
        parts.append(_U16.pack(len(sub)))
        parts.append(sub)
    parts.append(payload)
    body = b"".join(parts)
    return _HEAD.pack(len(body) + 1, flags) + body


def pack(frames: list[bytes]) -> bytes:
    return _compressor.compress(b"".join(frames))


@dataclass(frozen=True, slots=True)
class Frame:
    message_id: uuid.UUID
    trace_id: uuid.UUID | None
    transaction_id: str
    payload: bytes
    producer_sub: str | None = None
    sealed: bool = False  # flag 4: ``payload`` is sealed bytes (queen_pg/security/crypto.py), not JSON


CODEC_RAW = 0
CODEC_ZSTD = 1


def unpack(blob: bytes, codec: int = CODEC_ZSTD) -> Iterator[Frame]:
    raw = _decompressor.decompress(blob) if codec == CODEC_ZSTD else blob
    at = 0
    end = len(raw)
    while at < end:
        body_len, flags = _HEAD.unpack_from(raw, at)
        stop = at + 4 + body_len
        pos = at + 5
        message_id = fast_uuid(raw[pos : pos + 16])
        pos += 16
        trace_id = None
        if flags & FLAG_TRACE:
            trace_id = fast_uuid(raw[pos : pos + 16])
            pos += 16
        (tlen,) = _U16.unpack_from(raw, pos)
        pos += 2
        transaction_id = raw[pos : pos + tlen].decode()
        pos += tlen
        producer_sub = None
        if flags & FLAG_SUB:
            (slen,) = _U16.unpack_from(raw, pos)
            pos += 2
            producer_sub = raw[pos : pos + slen].decode(errors="replace")
            pos += slen
        yield Frame(message_id, trace_id, transaction_id, raw[pos:stop], producer_sub, bool(flags & FLAG_SEALED))
        at = stop
