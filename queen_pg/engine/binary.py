"""The binary request bodies (docs/wire.md#binary-formats): QPB1 push and QTB1 transaction, parsed and checked.

    "QPB1" | u8 flags | [u32 raw_len, flag 1] | u32 groups | per group: u16 len+queue | u16 len+partition
           | u32 n | flag 8: u32 z_len | z   (z = ONE zstd frame, content size set, of n QPF1 frames)
                   | else:   n x ([u16 len+transactionId, flag 4] | u32 len+payload JSON)
    "QTB1" | u8 flags | u32 len+head JSON | u32 groups | the groups as with flag 8

Every read is bounds-checked; anything that does not add up is :class:`Malformed` with the byte offset
in the body (inside a zstd group: the offset of the group's blob, and the position in its decompressed
frames in the text), never an exception of another kind. What is checked: the magic and flags, every
length against what is left, counts against the bytes that could hold them (a count that lies fails
before anything is allocated for it), the zstd frame (exactly one, content size declared and within the
budget, nothing after it), each frame (flags 0 or 1: a client's frame never carries a producerSub or the
encrypted flag; a version-7 message id, unique in the body; a non-empty transactionId of valid UTF-8
without a control character (docs/wire.md#text); a payload that is JSON the broker can hand back
exactly, as ``stored_json`` demands of a JSON push). Names are checked by the route (``check_name``),
as for JSON.

A flag-8 group keeps its zstd blob: when nothing needs rewriting (:func:`needs_rewrite`) the blob is
stored as the segment as it came (queen_pg/engine/push_binary.py), and the frames are only read to hash
the transactionIds and check the rules above.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

import xxhash
import zstandard

from queen_pg import text
from queen_pg.db.types import fast_uuid
from queen_pg.engine import json_check
from queen_pg.engine.codec import dctx

PUSH_MAGIC = b"QPB1"
TXN_MAGIC = b"QTB1"
FLAG_ZSTD = 1
FLAG_COUNTS = 2
FLAG_TXN = 4
FLAG_FRAMES = 8
PUSH_FLAGS = FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES
FRAME_TRACE = 1  # the only frame flag a client may set (codec.FLAG_TRACE)
MAX_TXN_BYTES = 65_535

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FRAME_HEAD = struct.Struct("<IB")


class Malformed(Exception):
    """A binary body that does not add up: ``offset`` = the byte of the body where it stopped."""

    def __init__(self, offset: int, what: str) -> None:
        self.offset = offset
        self.what = what
        super().__init__(f"{what} (at byte {offset})")


class TooLarge(Malformed):
    """The decompressed bytes exceed the limit (the cap of decoded bytes): 413 ``decoded_too_large``."""


class TooMany(Malformed):
    """The groups' message counts add up past the item limit (QUEEN_MAX_ITEMS): 413 ``too_many_items``.
    Raised on reading a group's count, before its messages are read."""

    def __init__(self, offset: int, count: int) -> None:
        self.count = count
        super().__init__(offset, f"the binary body holds {count} messages or more")


@dataclass(slots=True)
class Group:
    """One (queue, partition) group of a body, its messages as columns (one entry per message, in
    body order): no object per message."""

    queue: str
    partition: str
    txns: list[str]  # "" = the broker mints one (flag 0/4 only)
    payloads: list[bytes]
    ids: bytes = b""  # flag 8: the client-minted message ids, 16 bytes each
    hashes: bytes = b""  # flag 8: xxh3-128 of each transactionId, 16 bytes each
    traces: list[uuid.UUID | None] | None = None  # flag 8 frames with trace ids (None: no frame has one)
    blob: bytes | None = None  # flag 8: the zstd frame as it came
    offset: int = 0  # where the group starts in the body

    def __len__(self) -> int:
        return len(self.txns)

    def message_ids(self) -> list[uuid.UUID]:
        ids = self.ids
        return [fast_uuid(ids[i : i + 16]) for i in range(0, len(ids), 16)]


@dataclass(slots=True)
class Body:
    flags: int
    groups: list[Group] = field(default_factory=list)
    head: bytes = b""  # QTB1: the JSON head

    @property
    def counts_only(self) -> bool:
        return bool(self.flags & FLAG_COUNTS)

    @property
    def framed(self) -> bool:
        return bool(self.flags & FLAG_FRAMES)


class _In:
    """Little-endian reads off ``data`` that report the body offset (``base`` + position) on failure."""

    __slots__ = ("at", "base", "data", "where")

    def __init__(self, data: bytes, base: int = 0, where: str = "") -> None:
        self.data = data
        self.at = 0
        self.base = base
        self.where = where

    def fail(self, what: str, at: int | None = None) -> Malformed:
        pos = self.at if at is None else at
        if self.where:  # inside decompressed frames: the blob's offset, the position in the text
            return Malformed(self.base, f"{self.where}: {what} at byte {pos} of its decompressed frames")
        return Malformed(self.base + pos, what)

    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.at:
            raise self.fail(f"{what}: {n} bytes declared, {self.left()} left")
        piece = self.data[self.at : self.at + n]
        self.at += n
        return piece

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def _uint(self, width: struct.Struct, what: str) -> int:
        size = width.size
        if len(self.data) - self.at < size:
            raise self.fail(f"{what}: truncated")
        (v,) = width.unpack_from(self.data, self.at)
        self.at += size
        return int(v)

    def u16(self, what: str) -> int:
        return self._uint(_U16, what)

    def u32(self, what: str) -> int:
        return self._uint(_U32, what)

    def text16(self, what: str) -> str:
        at = self.at
        raw = self.take(self.u16(f"{what} length"), what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8", at) from None


def check_payload(payload: bytes) -> None:
    """Raises ValueError (or TypeError) unless ``payload`` is one JSON document that comes back exactly
    (64-bit integers, nesting within 254 levels, no lone surrogates): what a JSON push stores. U+0000
    is fine (a payload lives in a segment, not a text column). A big one is checked without being
    built (json_check.py)."""
    json_check.check(payload, nul_ok=True)


def _check_txn(raw: bytes) -> str:
    if not raw:
        raise ValueError("an empty transactionId")
    if text.utf8_has_control(raw):
        raise ValueError(f"the transactionId {text.MESSAGE}")
    return raw.decode()  # UnicodeDecodeError is a ValueError


# A frame without a trace id: u32 body_len | u8 flags | u8[16] message id | u16 transactionId length.
_PLAIN_HEAD = struct.Struct("<IB16sH")
_V7_BYTE6 = bytes(0x70 | x for x in range(16))  # byte 6 of a version-7 id
_V7_BYTE8 = bytes(0x80 | x for x in range(64))  # byte 8: the RFC 4122 variant


@dataclass(slots=True)
class Frames:
    """A group's checked frames, as columns."""

    txns: list[str]
    payloads: list[bytes]
    ids: bytes  # 16 bytes per frame
    hashes: bytes  # xxh3-128 of each transactionId, 16 bytes per frame
    traces: list[uuid.UUID | None] | None  # None: no frame has a trace id


def _plain_frames(raw: bytes, n: int, seen: set[bytes]) -> Frames | None:
    """The fast path of :func:`parse_frames`: ``n`` frames without trace ids, walked for their
    lengths alone, every rule then checked once over all of them (ids' version and variant a column
    at a time, repeats by a set, control characters and UTF-8 over the joined transactionIds). None
    when anything is off (or a frame carries a trace id): the strict walk then finds the first fault
    and words it. Adds the ids to ``seen`` only when it answers."""
    end_all = len(raw)
    unpack = _PLAIN_HEAD.unpack_from
    mids: list[bytes] = []
    traws: list[bytes] = []
    payloads: list[bytes] = []
    at = 0
    for _ in range(n):
        if at + 23 > end_all:
            return None
        body_len, flags, mid, tlen = unpack(raw, at)
        end = at + 4 + body_len
        p = at + 23 + tlen
        if flags or body_len < 19 or end > end_all or p > end:
            return None
        mids.append(mid)
        traws.append(raw[at + 23 : p])
        payloads.append(raw[p:end])
        at = end
    if at != end_all:
        return None
    ids = b"".join(mids)
    if ids[6::16].translate(None, _V7_BYTE6) or ids[8::16].translate(None, _V7_BYTE8):
        return None
    if len(set(mids)) != n or not seen.isdisjoint(mids) or b"" in traws:
        return None
    joined = b"".join(traws)
    if len(joined.translate(None, text.C0_AND_DEL)) != len(joined) or (
        b"\xc2" in joined and text.utf8_has_control(joined)
    ):
        return None
    try:
        # "\n" cannot be in a checked transactionId, and an ASCII byte ends any UTF-8 sequence: the
        # joined text decodes exactly when every transactionId does
        txns = b"\n".join(traws).decode().split("\n")
        for payload in payloads:
            check_payload(payload)
    except (ValueError, TypeError):
        return None
    seen.update(mids)
    digest = xxhash.xxh3_128_digest
    return Frames(txns, payloads, ids, b"".join([digest(t) for t in traws]), None)


def parse_frames(raw: bytes, n: int, src: _In, seen: set[bytes]) -> Frames:
    """The ``n`` QPF1 frames of a decompressed group, checked; their transactionIds hashed."""
    inn = _In(raw, src.base, src.where)
    if n * 23 > len(raw):  # u32 len | u8 flags | 16 id | u16 txn len: 23 bytes at least
        raise inn.fail(f"{n} frames cannot fit in {len(raw)} bytes", 0)
    fast = _plain_frames(raw, n, seen)
    if fast is not None:
        return fast
    txns: list[str] = []
    payloads: list[bytes] = []
    mids: list[bytes] = []
    hashes: list[bytes] = []
    traces: list[uuid.UUID | None] = []
    data = raw
    for k in range(n):
        start = inn.at
        if inn.left() < 5:
            raise inn.fail(f"frame {k} of {n}: truncated (the frame count says {n})")
        body_len, flags = _FRAME_HEAD.unpack_from(data, start)
        end = start + 4 + body_len
        if body_len < 19 or end > len(data):
            raise inn.fail(f"frame {k}: body length {body_len} does not fit", start)
        if flags & ~FRAME_TRACE:
            what = "a producerSub (flag 2) is set by the broker from the token, never by a client" if flags & 2 else (
                f"frame flags {flags} (a client may set only 1 = trace id)")  # fmt: skip
            raise inn.fail(f"frame {k}: {what}", start + 4)
        pos = start + 5
        mid = data[pos : pos + 16]
        if (mid[6] >> 4) != 7 or (mid[8] & 0xC0) != 0x80:
            raise inn.fail(f"frame {k}: the message id is not a version-7 UUID", pos)
        if mid in seen:
            raise inn.fail(f"frame {k}: message id {fast_uuid(mid)} repeats one of this body", pos)
        seen.add(mid)
        pos += 16
        trace = None
        if flags & FRAME_TRACE:
            if pos + 16 > end:
                raise inn.fail(f"frame {k}: the trace id does not fit", pos)
            trace = fast_uuid(data[pos : pos + 16])
            pos += 16
        if pos + 2 > end:
            raise inn.fail(f"frame {k}: the transactionId length does not fit", pos)
        (tlen,) = _U16.unpack_from(data, pos)
        pos += 2
        if pos + tlen > end:
            raise inn.fail(f"frame {k}: transactionId of {tlen} bytes does not fit", pos - 2)
        traw = data[pos : pos + tlen]
        try:
            txn = _check_txn(traw)
        except ValueError as exc:
            raise inn.fail(f"frame {k}: {exc}", pos) from None
        pos += tlen
        payload = data[pos:end]
        try:
            check_payload(payload)
        except (ValueError, TypeError) as exc:
            raise inn.fail(f"frame {k}: the payload is not JSON that can be stored exactly ({exc})", pos) from None
        txns.append(txn)
        payloads.append(payload)
        mids.append(mid)
        hashes.append(xxhash.xxh3_128_digest(traw))
        traces.append(trace)
        inn.at = end
    if inn.left():
        raise inn.fail(f"{inn.left()} bytes after the {n} frames the count declares")
    has_trace = any(t is not None for t in traces)
    return Frames(txns, payloads, b"".join(mids), b"".join(hashes), traces if has_trace else None)


def _group_frames(
    inn: _In, g: int, n: int, budget: list[int], seen: set[bytes], most: tuple[int, int]
) -> tuple[bytes, Frames]:
    count_at = inn.base + inn.at - 4
    zlen = inn.u32(f"group {g}: compressed length")
    at = inn.at
    blob = inn.take(zlen, f"group {g}: zstd frame")
    where = f"group {g}"
    try:
        size = zstandard.get_frame_parameters(blob).content_size
    except zstandard.ZstdError as exc:
        raise Malformed(inn.base + at, f"{where}: not a zstd frame ({exc})") from None
    if size == zstandard.CONTENTSIZE_UNKNOWN or size < 0:
        raise Malformed(inn.base + at, f"{where}: the zstd frame must declare its content size")
    if size > budget[0]:
        raise TooLarge(inn.base + at, f"{where}: {size} decompressed bytes exceed the limit")
    if n * 23 > size:  # u32 len | u8 flags | 16 id | u16 txn len: 23 bytes at least; a count that lies
        raise _In(b"", inn.base + at, where).fail(f"{n} frames cannot fit in {size} bytes", 0)
    if most[0] + n > most[1]:  # before anything is inflated
        raise TooMany(count_at, most[0] + n)
    budget[0] -= size
    dec = dctx().decompressobj()  # a big body is parsed in a worker thread (api/decoded.py)
    try:
        raw = dec.decompress(blob)
    except zstandard.ZstdError as exc:
        raise Malformed(inn.base + at, f"{where}: bad zstd data ({exc})") from None
    if not dec.eof or len(raw) != size:
        raise Malformed(inn.base + at, f"{where}: the zstd frame is truncated")
    if dec.unused_data:
        raise Malformed(inn.base + at + zlen - len(dec.unused_data), f"{where}: bytes after the one zstd frame")
    return blob, parse_frames(raw, n, _In(raw, inn.base + at, where), seen)


def _group_items(inn: _In, g: int, n: int, with_txn: bool, most: tuple[int, int]) -> tuple[list[str], list[bytes]]:
    if n * (6 if with_txn else 4) > inn.left():
        raise inn.fail(f"group {g}: {n} items cannot fit in the {inn.left()} bytes left")
    if most[0] + n > most[1]:  # before an item is read
        raise TooMany(inn.base + inn.at - 4, most[0] + n)
    txns: list[str] = []
    payloads: list[bytes] = []
    for k in range(n):
        txn = ""
        if with_txn:
            at = inn.at
            traw = inn.take(inn.u16(f"group {g} item {k}: transactionId length"), f"group {g} item {k}: transactionId")
            if traw:
                try:
                    txn = _check_txn(traw)
                except ValueError as exc:
                    raise inn.fail(f"group {g} item {k}: {exc}", at + 2) from None
        at = inn.at
        payload = inn.take(inn.u32(f"group {g} item {k}: payload length"), f"group {g} item {k}: payload")
        try:
            check_payload(payload)
        except (ValueError, TypeError) as exc:
            what = f"group {g} item {k}: the payload is not JSON that can be stored exactly ({exc})"
            raise inn.fail(what, at + 4) from None
        txns.append(txn)
        payloads.append(payload)
    return txns, payloads


def _groups(inn: _In, framed: bool, with_txn: bool, limit: int, max_items: int, empty_ok: bool = False) -> list[Group]:
    count = inn.u32("group count")
    if count == 0 and not empty_ok:
        raise inn.fail("no groups: a push carries at least one message", inn.at - 4)
    if count * 9 > inn.left():  # u16 + u16 + u32 + (u32 or an item) at least
        raise inn.fail(f"{count} groups cannot fit in the {inn.left()} bytes left", inn.at - 4)
    groups: list[Group] = []
    budget = [limit]
    seen: set[bytes] = set()
    items = 0
    for g in range(count):
        start = inn.at
        queue = inn.text16(f"group {g}: queue")
        partition = inn.text16(f"group {g}: partition")
        n = inn.u32(f"group {g}: message count")
        if n == 0:
            raise inn.fail(f"group {g}: no messages", inn.at - 4)
        most = (items, max_items)  # the messages of the groups before this one, and QUEEN_MAX_ITEMS
        if framed:
            blob, f = _group_frames(inn, g, n, budget, seen, most)
            groups.append(Group(queue, partition, f.txns, f.payloads, f.ids, f.hashes, f.traces, blob, start))
        else:
            txns, payloads = _group_items(inn, g, n, with_txn, most)
            groups.append(Group(queue, partition, txns, payloads, offset=start))
        items += n
    if inn.left():
        raise inn.fail(f"{inn.left()} bytes after the {count} groups")
    return groups


def declared_expansion(data: bytes) -> int:
    """The bytes a QPB1 or QTB1 body says it decompresses to (a zstd body's raw length, or what its
    groups' frames declare), read off its headers without inflating anything; so its route can refuse
    and charge them first. A body that does not add up counts what it declared before the fault (the
    parser then finds and words the fault)."""
    inn = _In(data)
    total = 0
    try:
        magic = inn.take(4, "magic")
        flags = inn.u8("flags")
        if magic == PUSH_MAGIC and flags & FLAG_ZSTD:
            return inn.u32("raw length")
        if magic == TXN_MAGIC:
            inn.take(inn.u32("head length"), "head")
        elif magic != PUSH_MAGIC or not flags & FLAG_FRAMES:
            return 0
        for _ in range(inn.u32("group count")):
            inn.text16("queue")
            inn.text16("partition")
            inn.u32("message count")
            blob = inn.take(inn.u32("compressed length"), "zstd frame")
            try:
                total += max(zstandard.frame_content_size(blob[:18]), 0)
            except zstandard.ZstdError:
                return total
    except Malformed:
        pass
    return total


def _magic_and_flags(inn: _In, magic: bytes, what: str, known: int) -> int:
    """The flags byte after the body's 4-byte magic; another magic, or a flag outside ``known``, is refused."""
    if inn.take(4, "magic") != magic:
        raise Malformed(0, f"not a binary {what} body (magic {magic.decode()})")
    flags = inn.u8("flags")
    if flags & ~known:
        raise Malformed(4, f"unknown flags {flags}")
    return flags


def parse_push(data: bytes, limit: int, max_items: int) -> Body:
    """A QPB1 body; ``limit`` bounds the decompressed bytes (QUEEN_MAX_DECODED_BYTES), ``max_items`` its
    messages (QUEEN_MAX_ITEMS)."""
    inn = _In(data)
    flags = _magic_and_flags(inn, PUSH_MAGIC, "push", PUSH_FLAGS)
    framed = bool(flags & FLAG_FRAMES)
    if framed and flags & (FLAG_ZSTD | FLAG_TXN):
        raise Malformed(4, "flag 8 (frames) goes with neither 1 (zstd body) nor 4 (transactionIds)")
    if flags & FLAG_ZSTD:
        raw_len = inn.u32("raw length")
        if raw_len > limit:
            raise TooLarge(5, f"raw length {raw_len} exceeds the limit")
        blob = data[inn.at :]
        dec = dctx().decompressobj()
        try:
            # a bounded read first: a small frame of zeros may expand a thousandfold, and the frame
            # need not declare its size, so never decompress more than raw_len + 1 bytes unchecked
            with dctx().stream_reader(blob, read_across_frames=False) as head:
                if len(head.read(raw_len + 1)) != raw_len:
                    raise Malformed(inn.at, f"the zstd body does not decompress to {raw_len} bytes")
            raw = dec.decompress(blob)
        except zstandard.ZstdError as exc:
            raise Malformed(inn.at, f"bad zstd data ({exc})") from None
        if not dec.eof or len(raw) != raw_len or dec.unused_data:
            raise Malformed(inn.at, f"the zstd body is not one frame of {raw_len} bytes")
        # offsets inside a compressed body are positions in the decompressed body after byte 9
        return Body(flags, _groups(_In(raw, 9), False, bool(flags & FLAG_TXN), limit, max_items))
    return Body(flags, _groups(inn, framed, bool(flags & FLAG_TXN), limit, max_items))


def parse_transaction(data: bytes, limit: int, max_items: int) -> Body:
    """A QTB1 body: the JSON head (bytes; the route decodes it) and flag-8 groups of at most ``max_items``
    messages (the route counts the head's items with them)."""
    inn = _In(data)
    flags = _magic_and_flags(inn, TXN_MAGIC, "transaction", FLAG_COUNTS)
    head = inn.take(inn.u32("head length"), "head")
    return Body(flags, _groups(inn, True, True, limit, max_items, empty_ok=True), head)
