"""Per-request (not per-message) work on push: message ids minted for a whole request at once
(``codec.uuid7_blob``), frames packed and transactionIds hashed in one pass (``push.prepare``), and a
binary group's frames checked all at once (``binary._plain_frames``) with the strict walk kept to find
and word the first fault. These tests hold the bulk forms to what the one-at-a-time forms did."""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import httpx
import pytest
import xxhash
import zstandard

from queen_pg.engine import binary, codec
from queen_pg.engine import push as push_engine

RANDOM_BITS = ((1 << 80) - 1) & ~((0xF << 76) | (0x3 << 62))  # below the timestamp, but version and variant


def _ids(blob: bytes) -> list[uuid.UUID]:
    return [uuid.UUID(bytes=blob[i : i + 16]) for i in range(0, len(blob), 16)]


def test_ids_minted_in_bulk_are_distinct_version7_and_time_ordered() -> None:
    before = time.time_ns() // 1_000_000
    first = _ids(codec.uuid7_blob(5000))
    second = _ids(codec.uuid7_blob(3))
    after = time.time_ns() // 1_000_000
    assert len(first) == 5000 and len(second) == 3
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in first + second)
    assert len(set(first + second)) == 5003
    stamps = [i.int >> 80 for i in first + second]
    assert all(before <= s <= after for s in stamps)
    assert len({i.int >> 80 for i in first}) == 1  # one clock read per request
    assert max(i.int >> 80 for i in first) <= min(i.int >> 80 for i in second)  # ordered across requests
    seen = 0
    for i in first:
        seen |= i.int & RANDOM_BITS
    assert seen == RANDOM_BITS  # every random bit varies: the masks keep nothing else fixed
    assert codec.uuid7_blob(0) == b"" and codec.uuid7_many(0) == []
    many = codec.uuid7_many(4)
    assert [m.version for m in many] == [7] * 4 and [str(m) for m in many] == [
        str(uuid.UUID(bytes=m.bytes)) for m in many
    ]


def test_prepare_packs_what_encode_frame_packs_and_hashes_each_transaction_id() -> None:
    trace = uuid.uuid4()
    own = codec.uuid7()
    items = [
        push_engine.NewMessage("q", "a", b'{"x":1}', "t-1", None),
        push_engine.NewMessage("q", "b", b'"\\u0000"', None, None),  # minted id as its transactionId
        push_engine.NewMessage("q", "a", b"[1,2]", "t-é", trace),  # a trace id: codec.encode_frame
        push_engine.NewMessage("q", "a", b"3", "t-3", None, "sub-1", own),  # a producerSub, a client id
    ]
    p = push_engine.prepare(items)
    assert p.queues == ["q", "q"] and p.partitions == ["a", "b"] and p.item_group == [1, 2, 1, 1]
    assert p.msgids[3] == own and p.txns == ["t-1", str(p.msgids[1]), "t-é", "t-3"]
    assert p.msgid_blob == b"".join(m.bytes for m in p.msgids)
    assert p.hash_blob == b"".join(xxhash.xxh3_128_digest(t.encode()) for t in p.txns)
    assert p.hashes == [codec.txn_hash(t) for t in p.txns]
    frames_a = list(codec.unpack(p.blobs[0]))
    assert [(f.message_id, f.transaction_id, f.payload, f.trace_id, f.producer_sub) for f in frames_a] == [
        (p.msgids[0], "t-1", b'{"x":1}', None, None),
        (p.msgids[2], "t-é", b"[1,2]", trace, None),
        (own, "t-3", b"3", None, "sub-1"),
    ]
    expected = [
        codec.encode_frame(p.msgids[0], "t-1", b'{"x":1}', None),
        codec.encode_frame(p.msgids[2], "t-é", b"[1,2]", trace),
        codec.encode_frame(own, "t-3", b"3", None, "sub-1"),
    ]
    assert zstandard.ZstdDecompressor().decompress(p.blobs[0]) == b"".join(expected)


async def test_a_json_push_without_transaction_ids_gets_distinct_version7_ids(http: httpx.AsyncClient) -> None:
    body = {"items": [{"queue": "mint", "partition": f"p{i % 3}", "payload": i} for i in range(300)]}
    r1 = await http.post("/api/v1/push", json=body)
    r2 = await http.post("/api/v1/push", json=body)
    assert r1.status_code == r2.status_code == 201, r1.text
    res = r1.json() + r2.json()
    assert [r["status"] for r in res] == ["queued"] * 600  # minted ids are never duplicates of each other
    ids = [uuid.UUID(r["messageId"]) for r in res]
    assert len(set(ids)) == 600 and all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(r["transactionId"] == r["messageId"] for r in res)
    assert max(i.int >> 80 for i in ids[:300]) <= min(i.int >> 80 for i in ids[300:])


# --- binary frames: the all-at-once check against the strict walk -----------------------------------


def _mid(k: int, version: int = 7) -> bytes:
    return uuid.UUID(int=(0x1234 << 80) | (version << 76) | (2 << 62) | k).bytes


def _frame(k: int, txn: bytes = b"", payload: bytes = b"1", flags: int = 0, mid: bytes | None = None) -> bytes:
    txn = txn or b"t-%d" % k
    trace = uuid.UUID(int=k + 1).bytes if flags & 1 else b""
    body = bytes([flags]) + (mid or _mid(k)) + trace + struct.pack("<H", len(txn)) + txn + payload
    return struct.pack("<I", len(body)) + body


def _body(*groups: list[bytes], tail: bytes = b"") -> bytes:
    out = b"QPB1\x08" + struct.pack("<I", len(groups))
    for g, frames in enumerate(groups):
        z = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(b"".join(frames) + tail)
        q, p = b"q", b"p%d" % g
        out += struct.pack("<H", 1) + q + struct.pack("<H", len(p)) + p + struct.pack("<II", len(frames), len(z)) + z
    return out


def _strict(monkeypatch: pytest.MonkeyPatch, data: bytes) -> Any:
    with monkeypatch.context() as m:
        m.setattr(binary, "_plain_frames", lambda raw, n, seen: None)
        return binary.parse_push(data, 1 << 20, 10_000)


def _outcome(parse: Any) -> Any:
    try:
        body = parse()
    except binary.Malformed as exc:
        return ("refused", exc.offset, str(exc))
    return [(g.queue, g.partition, g.txns, g.payloads, g.ids, g.hashes, g.traces, g.blob) for g in body.groups]


FIVE = [_frame(k) for k in range(5)]
GOOD: dict[str, bytes] = {
    "plain": _body(FIVE),
    "two groups": _body(FIVE, [_frame(k) for k in range(5, 8)]),
    "multibyte transactionIds": _body(
        [_frame(0, "é-ü".encode()), _frame(1, "日本".encode()), _frame(2, b"\xf0\x9f\x98\x80")]
    ),
    "payload kinds": _body(
        [
            _frame(0, payload=b'{"a":[1,{"b":null}]}'),
            _frame(1, payload=b' "s" '),
            _frame(2, payload=b"-1.5e3"),
            _frame(3, payload=b'"\\u0000"'),
        ]
    ),
    "a trace id (strict walk)": _body([_frame(0), _frame(1, flags=1), _frame(2)]),
}
BAD: dict[str, bytes] = {
    "id not v7 in frame 3": _body([*FIVE[:3], _frame(3, mid=_mid(3, version=4)), FIVE[4]]),
    "bad variant in frame 2": _body([*FIVE[:2], _frame(2, mid=bytes([*_mid(2)[:8], 0x40, *_mid(2)[9:]])), *FIVE[3:]]),
    "id repeated in the group": _body([*FIVE[:4], _frame(9, mid=_mid(1))]),
    "id repeated across groups": _body(FIVE, [_frame(5), _frame(6, mid=_mid(2))]),
    "control character in frame 4": _body([*FIVE[:4], _frame(4, b"a\x01b")]),
    "DEL in frame 1": _body([FIVE[0], _frame(1, b"a\x7f"), *FIVE[2:]]),
    "C1 in frame 2": _body([*FIVE[:2], _frame(2, "a\x85".encode()), *FIVE[3:]]),
    "UTF-8 split across two transactionIds": _body([_frame(0, b"x\xc3"), _frame(1, b"\xa9y"), FIVE[2]]),
    "invalid UTF-8 in frame 2": _body([*FIVE[:2], _frame(2, b"\xed\xa0\x80"), *FIVE[3:]]),  # a surrogate
    "empty transactionId in frame 3": _body([*FIVE[:3], struct.pack("<IB", 19, 0) + _mid(3) + b"\x00\x00", FIVE[4]]),
    "payload not JSON in frame 4": _body([*FIVE[:4], _frame(4, payload=b"{nope")]),
    "payloads that join into JSON": _body(
        [_frame(0, payload=b"[1"), _frame(1, payload=b"2]"), _frame(2, payload=b"3,4")]
    ),
    "payload integer beyond 64 bits": _body([*FIVE[:2], _frame(2, payload=b"1" * 30), *FIVE[3:]]),
    "producerSub flag in frame 2": _body([*FIVE[:2], _frame(2, flags=2), *FIVE[3:]]),
    "frame length lies in frame 4": _body([*FIVE[:4], struct.pack("<I", 999) + FIVE[4][4:]]),
    "txn length lies in frame 1": _body([FIVE[0], FIVE[1][:21] + b"\xff\x00" + FIVE[1][23:], *FIVE[2:]]),
    "bytes after the frames": _body(FIVE, tail=b"\x00\x00"),
}


@pytest.mark.parametrize("name", list(GOOD))
def test_good_frames_read_the_same_by_the_bulk_check_and_the_strict_walk(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    data = GOOD[name]
    fast = _outcome(lambda: binary.parse_push(data, 1 << 20, 10_000))
    assert fast != "refused" and fast == _outcome(lambda: _strict(monkeypatch, data))
    group = binary.parse_push(data, 1 << 20, 10_000).groups[0]
    assert group.hashes == b"".join(xxhash.xxh3_128_digest(t.encode()) for t in group.txns)
    if "trace" not in name:
        raw = zstandard.ZstdDecompressor().decompress(group.blob or b"")
        assert binary._plain_frames(raw, len(group), set()) is not None  # the bulk check answered


@pytest.mark.parametrize("name", list(BAD))
def test_bad_frames_are_refused_as_the_strict_walk_words_them(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data = BAD[name]
    fast = _outcome(lambda: binary.parse_push(data, 1 << 20, 10_000))
    assert fast[0] == "refused", (name, fast)
    assert fast == _outcome(lambda: _strict(monkeypatch, data))
    assert "frame" in fast[2] or "bytes after" in fast[2]


@pytest.mark.parametrize(
    "number", [b"-9300000000000000000", b"18446744073709551616", b"[1, 123456789012345678901234567890]"]
)
async def test_a_binary_payload_integer_beyond_64_bits_is_refused_as_in_a_json_push(
    http: httpx.AsyncClient, conn: Any, number: bytes
) -> None:
    """Regression: orjson reads such an integer as a float, so a binary push stored it (and handed back
    a rounded float) where a JSON push refuses it; the frame's id here is a valid version-7 one, so the
    payload rule is what is tested (tests/test_e2e_binary.py's hostile payload cases stop at their id)."""
    data = _body([_frame(0), _frame(1, payload=number)])
    r = await http.post("/api/v1/push", content=data, headers={"Content-Type": "application/x-queen-push"})
    assert r.status_code == 400, r.text
    assert "frame 1: the payload is not JSON that can be stored exactly" in r.json()["error"]
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 0
    j = await http.post("/api/v1/push", content=b'{"items":[{"queue":"q","payload":%s}]}' % number,
                        headers={"Content-Type": "application/json"})  # fmt: skip
    assert j.status_code == 400, j.text
    ok = _body([_frame(0, payload=b"18446744073709551615"), _frame(1, payload=b"-9223372036854775808")])
    r = await http.post("/api/v1/push", content=ok, headers={"Content-Type": "application/x-queen-push"})
    assert r.status_code == 201, r.text
    popped = await http.get("/api/v1/pop/queue/q/partition/p0", params={"batch": 2})
    assert [m["data"] for m in popped.json()["messages"]] == [18446744073709551615, -9223372036854775808]
