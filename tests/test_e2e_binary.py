"""The binary formats end to end (docs/wire.md#binary-formats): the official client's QPB1 flag-8 pushes stored
as they came, QTB1 transactions, QPF1 framed pops shipping the stored blobs; JSON and binary producers and consumers
sharing one queue; dedup; producerSub from the token; and the hostile sweep (every malformed body a 400
with the byte offset, nothing written). The JSON flows with the binary client are
tests/test_e2e_client.py's, parametrized."""

from __future__ import annotations

import functools
import os
import resource
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import zstandard
from queen import Queen
from queen.http import http_client as client_http
from queen.http.pop_frames import decode_pop_frames
from queen.http.push_binary import PushBatch, encode_push_binary, encode_push_frames, encode_transaction_frames

from tests.conftest import Broker
from tests.helpers import hot_client
from tests.test_security_jwt import JWT_ON, token

BINARY = {"binary_push": True, "push_compression": True, "framed_pop": True}
PUSH_TYPE = {"Content-Type": "application/x-queen-push"}


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What the official client put on the wire: its binary push bodies and the framed pop answers it
    decoded (so a test knows the binary paths were taken, not a JSON fallback)."""
    seen: dict[str, list[Any]] = {"pushes": [], "pops": []}
    encode, decode = client_http.binary_push_body, client_http.decode_pop_frames

    def push_body(items: Any, compress: bool) -> bytes | None:
        body = encode(items, compress)
        seen["pushes"].append(body)
        return body

    def pop_frames(data: bytes) -> dict[str, Any]:
        seen["pops"].append(data)
        return decode(data)

    monkeypatch.setattr(client_http, "binary_push_body", push_body)
    monkeypatch.setattr(client_http, "decode_pop_frames", pop_frames)
    return seen


@pytest.fixture
async def http(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    """The conftest client, also checking that the protocol answered every hot-route request (the tables
    run against the data plane as QUEEN_HOT_PROTOCOL=1 serves it)."""
    async with hot_client(broker) as client:
        yield client


def _groups_of(body: bytes) -> list[bytes]:
    """The zstd blobs of a flag-8 QPB1 body."""
    assert body[:5] == b"QPB1\x08"
    (count,) = struct.unpack_from("<I", body, 5)
    at, blobs = 9, []
    for _ in range(count):
        for _name in range(2):
            (n,) = struct.unpack_from("<H", body, at)
            at += 2 + n
        at += 4
        (z,) = struct.unpack_from("<I", body, at)
        blobs.append(body[at + 4 : at + 4 + z])
        at += 4 + z
    return blobs


async def test_binary_push_is_stored_as_sent_and_framed_pop_ships_it_back(
    broker: Broker, conn: Any, wire: dict[str, list[Any]]
) -> None:
    async with Queen(broker.url, **BINARY) as client:
        items = [{"data": {"i": i, "s": "é" * i}, "transactionId": f"t-{i}"} for i in range(50)]
        res = await client.queue("bin").partition("p1").push(items)
        assert [r["status"] for r in res] == ["queued"] * 50
        assert [r["transactionId"] for r in res] == [f"t-{i}" for i in range(50)]
        (sent,) = wire["pushes"]
        (blob,) = _groups_of(sent)
        stored = await conn.fetch("SELECT payload, codec, base_offset, end_offset FROM queen.log_segments")
        assert len(stored) == 1 and bytes(stored[0]["payload"]) == blob  # not re-compressed
        assert stored[0]["codec"] == 1 and stored[0]["end_offset"] - stored[0]["base_offset"] == 50

        got = await client.queue("bin").group("g").batch(50).wait(False).pop()
        assert [m["data"] for m in got] == [it["data"] for it in items]
        assert [m["transactionId"] for m in got] == [f"t-{i}" for i in range(50)]
        (answer,) = wire["pops"]
        assert blob in answer  # the stored blob went out as it is
        assert (await client.ack(got, True, {"group": "g"}))["success"] is True
        assert await client.queue("bin").group("g").batch(5).wait(False).pop() == []


async def test_json_and_binary_producers_and_consumers_share_a_queue(broker: Broker) -> None:
    async with Queen(broker.url) as plain, Queen(broker.url, **BINARY) as binary:
        for n in range(6):
            who = binary if n % 2 else plain
            await who.queue("mix").partition("p").push([{"data": {"n": n, "k": k}} for k in range(3)])
        want = [{"n": n, "k": k} for n in range(6) for k in range(3)]
        for reader, group in ((plain, "json-reader"), (binary, "frame-reader")):
            got = await reader.queue("mix").partition("p").group(group).batch(100).wait(False).pop()
            assert [m["data"] for m in got] == want
            assert [m["offset"] for m in got] == list(range(18))
            assert all(m["partitionId"] == got[0]["partitionId"] and m["leaseId"] for m in got)
            assert (await reader.ack(got, True, {"group": group}))["success"] is True
        # and the two answers agree field by field on what both render
        await plain.queue("mix2").push([{"data": [1, None, "x"], "transactionId": "a"}])
        await binary.queue("mix2").push([{"data": {"deep": {"er": 1.5}}, "transactionId": "b"}])
        js = await plain.queue("mix2").group("x").batch(10).wait(False).pop()
        fr = await binary.queue("mix2").group("y").batch(10).wait(False).pop()
        keys = ("id", "transactionId", "data", "partitionId", "partition", "deliveryAttempt", "offset", "createdAt")
        assert [{k: m[k] for k in keys} for m in js] == [{k: m[k] for k in keys} for m in fr]
        assert all(m["consumerGroup"] == "y" for m in fr)


async def test_binary_dedup_within_and_across_bodies_and_framed_pop_skips_dropped_frames(
    broker: Broker, wire: dict[str, list[Any]]
) -> None:
    async with Queen(broker.url, **BINARY) as client:
        first = await client.queue("dd").push([{"data": 1, "transactionId": "a"}, {"data": 2, "transactionId": "b"}])
        assert [r["status"] for r in first] == ["queued", "queued"]
        again = await client.queue("dd").push(
            [{"data": 9, "transactionId": "a"}, {"data": 3, "transactionId": "c"}, {"data": 8, "transactionId": "c"}]
        )
        assert [r["status"] for r in again] == ["duplicate", "queued", "duplicate"]
        assert again[0]["messageId"] == first[0]["messageId"]  # the original's id
        got = await client.queue("dd").batch(10).wait(False).pop()
        assert [(m["data"], m["offset"]) for m in got] == [(1, 0), (2, 1), (3, 2)]
        assert len(wire["pops"]) == 1


async def test_framed_pop_cuts_a_segment_the_lease_covers_in_part(broker: Broker, conn: Any) -> None:
    async with Queen(broker.url, **BINARY) as client:
        await client.queue("part").push([{"data": i} for i in range(10)])
        seen: list[int] = []
        for _ in range(4):
            got = await client.queue("part").group("g").batch(3).wait(False).pop()
            seen += [m["data"] for m in got]
            assert [m["offset"] for m in got] == [m["data"] for m in got]
            assert (await client.ack(got, True, {"group": "g"}))["success"] is True
        assert seen == list(range(10))


async def test_framed_pop_splits_redelivered_and_fresh_messages_by_attempt(broker: Broker, conn: Any) -> None:
    async with Queen(broker.url, **BINARY) as client:
        await client.queue("re").push([{"data": i} for i in range(3)])
        got = await client.queue("re").group("g").batch(10).wait(False).pop()
        assert [m["deliveryAttempt"] for m in got] == [1, 1, 1]
        await conn.execute("UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second'")
        await client.queue("re").push([{"data": 3}])
        got = await client.queue("re").group("g").batch(10).wait(False).pop()
        assert [(m["data"], m["deliveryAttempt"]) for m in got] == [(0, 2), (1, 2), (2, 2), (3, 1)]


async def test_binary_transaction_acks_and_pushes_in_one_commit(broker: Broker) -> None:
    async with Queen(broker.url, **BINARY) as client, Queen(broker.url) as plain:
        await client.queue("in").push([{"data": {"job": 1}, "transactionId": "job-1"}])
        (msg,) = await client.queue("in").group("w").batch(1).wait(False).pop()
        tx = (
            client.transaction()
            .queue("out")
            .partition("o")
            .push([{"data": {"done": 1}, "transactionId": "out-1"}, {"data": {"done": 2}}])
            .ack(msg, "completed", {"consumer_group": "w"})
        )
        result = await tx.commit()
        assert result and result["success"] is True
        types = [r["type"] for r in result["results"]]
        assert types == ["push", "push", "ack"]  # the client's order restored from the head-first answer
        assert result["results"][0]["transactionId"] == "out-1"
        assert await client.queue("in").group("w").batch(1).wait(False).pop() == []
        out = await plain.queue("out").partition("o").batch(10).wait(False).pop()
        assert [m["data"] for m in out] == [{"done": 1}, {"done": 2}]
        # a transaction whose ack is refused writes none of its framed pushes
        ghost = {**msg, "transactionId": "never-pushed"}
        tx = client.transaction().queue("out").partition("o").push([{"data": 3}])
        with pytest.raises(Exception, match="rolled back"):
            await tx.ack(ghost, "completed", {"consumer_group": "w"}).commit()
        assert len(await plain.queue("out").partition("o").group("count").batch(10).wait(False).pop()) == 2


async def test_binary_failed_acks_reach_the_dlq_with_the_payload(broker: Broker) -> None:
    async with Queen(broker.url, **BINARY) as client:
        await client.queue("flaky").config({"retry_limit": 0}).create()
        await client.queue("flaky").push([{"data": {"n": 7}, "transactionId": "n-7"}])
        (m,) = await client.queue("flaky").group("g").batch(1).wait(False).pop()
        await client.ack(m, False, {"group": "g", "error": "boom"})
        dlq = await client.queue("flaky").dlq("g").limit(10).get()
        assert dlq["total"] == 1 and dlq["messages"][0]["data"] == {"n": 7}


async def test_producer_sub_comes_from_the_token_never_from_a_frame(start_broker: Any, conn: Any) -> None:
    broker = await start_broker(**JWT_ON)
    bearer = token(sub="svc-bin")
    async with Queen(broker.url, bearer_token=bearer, **BINARY) as client:
        await client.queue("sub").push([{"data": 1, "transactionId": "s1"}])
        (m,) = await client.queue("sub").batch(1).wait(False).pop()
        assert m["producerSub"] == "svc-bin"
    # a client's frame that carries a producerSub (flag 2) is refused, not trusted
    body = _frames_body("sub", "Default", [_frame(b"t2", b"\x05\x00forgd1", flags=2)])
    async with httpx.AsyncClient(base_url=broker.url, headers={"Authorization": f"Bearer {bearer}"}) as http:
        r = await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)
    assert r.status_code == 400 and "producerSub" in r.json()["error"], r.text
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 1


async def test_binary_flag4_and_counts_answers(http: httpx.AsyncClient) -> None:
    body = encode_push_binary([PushBatch("f4", "p", [b'{"a":1}', b"[2]"], ["x1", ""])])
    r = await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)
    assert r.status_code == 201, r.text
    assert [x["status"] for x in r.json()] == ["queued", "queued"] and r.json()[0]["transactionId"] == "x1"
    again = encode_push_binary([PushBatch("f4", "p", [b"1", b"2"], ["x1", "x2"])], compress=True, counts=True)
    r = await http.post("/api/v1/push", content=again, headers=PUSH_TYPE)
    assert r.status_code == 201 and r.json() == {"count": 2, "queued": 1, "duplicate": 1, "error": None}
    pop = await http.get("/api/v1/pop/queue/f4?batch=10&frames=true")
    assert pop.headers["content-type"] == "application/x-queen-pop"
    assert [m["data"] for m in decode_pop_frames(pop.content)["messages"]] == [{"a": 1}, [2], 2]


# --- the hostile sweep -----------------------------------------------------------------------------


def _frame(txn: bytes = b"t", payload: bytes = b"1", flags: int = 0, mid: bytes | None = None) -> bytes:
    # a valid version-7 id per transactionId (its first 6 bytes below the variant bits), so that each
    # case is refused for its own fault, not for the id
    mid = mid or uuid.UUID(int=(7 << 76) | (2 << 62) | int.from_bytes(txn.ljust(6, b"_")[:6], "big")).bytes
    body = bytes([flags]) + mid + struct.pack("<H", len(txn)) + txn + payload
    return struct.pack("<I", len(body)) + body


def _frames_body(
    queue: str, partition: str, frames: list[bytes], n: int | None = None, z: bytes | None = None
) -> bytes:
    if z is None:
        z = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(b"".join(frames))
    q, p = queue.encode(), partition.encode()
    head = b"QPB1\x08" + struct.pack("<I", 1) + struct.pack("<H", len(q)) + q + struct.pack("<H", len(p)) + p
    return head + struct.pack("<I", len(frames) if n is None else n) + struct.pack("<I", len(z)) + z


@functools.cache  # built once: the bodies hold random message ids, so their lengths vary per build
def _hostile() -> dict[str, bytes]:
    good = encode_push_frames([PushBatch("h", "p", [b'{"a":1}', b"2"], ["x", "y"])])
    zc = zstandard.ZstdCompressor(level=1, write_content_size=True)
    no_size = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(_frame())
    v4 = uuid.uuid4().bytes
    cases = {f"truncated at {n}": good[:n] for n in (0, 3, 4, 5, 8, 9, 12, 20, len(good) - 10, len(good) - 1)}
    cases |= {
        "bad magic": b"QPB2" + good[4:],
        "unknown flag": good[:4] + b"\x40" + good[5:],
        "flags 8 and 4 together": good[:4] + b"\x0c" + good[5:],
        "group count lies (huge)": good[:5] + struct.pack("<I", 10**9) + good[9:],
        "group count lies (two)": good[:5] + struct.pack("<I", 2) + good[9:],
        "trailing bytes": good + b"\x00",
        "frame count too high": _frames_body("h", "p", [_frame()], n=2),
        "frame count too low": _frames_body("h", "p", [_frame(b"a"), _frame(b"b")], n=1),
        "frame count absurd": _frames_body("h", "p", [_frame()], n=2**32 - 1),
        "zstd garbage": _frames_body("h", "p", [_frame()], z=b"\x28\xb5\x2f\xfd" + b"garbage-garbage"),
        "not zstd": _frames_body("h", "p", [_frame()], z=b"plain bytes"),
        "zstd without content size": _frames_body("h", "p", [_frame()], z=no_size),
        "zstd frame truncated": _frames_body("h", "p", [_frame()], z=zc.compress(_frame() * 5)[:-4]),
        "two zstd frames": _frames_body("h", "p", [_frame()], z=zc.compress(_frame()) + zc.compress(_frame(b"u"))),
        "frame length lies": _frames_body("h", "p", [struct.pack("<I", 500) + _frame()[4:]]),
        "frame too short": _frames_body("h", "p", [struct.pack("<IB", 3, 0) + b"ab"]),
        "txn length lies": _frames_body("h", "p", [_frame()[:21] + b"\xff\x00" + _frame()[23:]]),
        "message id not v7": _frames_body("h", "p", [_frame(mid=v4)]),
        "message id repeated": _frames_body("h", "p", [_frame(b"a"), _frame(b"a", b"2")]),
        "encrypted flag": _frames_body("h", "p", [_frame(flags=4)]),
        "producerSub flag": _frames_body("h", "p", [_frame(flags=2)]),
        "empty transactionId": _frames_body("h", "p", [_frame(b"")]),
        "control char transactionId": _frames_body("h", "p", [_frame(b"a\nb")]),
        "invalid utf-8 transactionId": _frames_body("h", "p", [_frame(b"\xff\xfe")]),
        "payload not JSON": _frames_body("h", "p", [_frame(payload=b"{nope")]),
        "payload empty": _frames_body("h", "p", [_frame(payload=b"")]),
        "payload two documents": _frames_body("h", "p", [_frame(payload=b"1 2")]),
        "payload integer beyond 64 bits": _frames_body("h", "p", [_frame(payload=b"123456789012345678901234567890")]),
        # 1023 levels: orjson reads them, msgspec (the exact re-read for long digit runs) recursed past
        # the interpreter's limit (RecursionError: a 500)
        "payload nested 1023 deep with a long integer": _frames_body(
            "h", "p", [_frame(payload=b"[" * 1023 + b"12345678901234567890" + b"]" * 1023)]
        ),
        "flag-4 payload nested 1023 deep with a long integer": encode_push_binary(
            [PushBatch("h", "p", [b"[" * 1023 + b"12345678901234567890" + b"]" * 1023], ["a"])]
        ),
        "no groups": b"QPB1\x08" + struct.pack("<I", 0),
        "empty queue name": _frames_body("", "p", [_frame()]),
        "zero messages": _frames_body("h", "p", [], n=0, z=zc.compress(b"")),
        "flag-4 payload length lies": encode_push_binary([PushBatch("h", "p", [b"1"], ["a"])])[:-5]
        + struct.pack("<I", 99)
        + b"1",
        "flag-1 raw length lies": encode_push_binary([PushBatch("h", "p", [b"1"])], compress=True)[:5]
        + struct.pack("<I", 3)
        + encode_push_binary([PushBatch("h", "p", [b"1"])], compress=True)[9:],
        "QTB1 on push": encode_transaction_frames(b"{}", [PushBatch("h", "p", [b"1"], ["a"])]),
    }
    return cases


@pytest.mark.parametrize("name", list(_hostile()))
async def test_hostile_binary_push_is_400_with_offset_and_writes_nothing(
    http: httpx.AsyncClient, conn: Any, name: str
) -> None:
    r = await http.post("/api/v1/push", content=_hostile()[name], headers=PUSH_TYPE)
    assert r.status_code == 400, (name, r.status_code, r.text)
    err = r.json()
    assert err["code"] in ("bad_binary", "bad_request") and isinstance(err.get("offset", 0), int), err
    if err["code"] == "bad_binary":
        assert 0 <= err["offset"] <= len(_hostile()[name]) and "at byte" in err["error"], err
    if name != "message id not v7":
        assert "version-7" not in err["error"], err  # refused for the case's own fault
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.queues") == 0


async def test_hostile_binary_bodies_beyond_the_limits(start_broker: Any, conn: Any) -> None:
    broker = await start_broker(max_body_bytes=64 * 1024)
    # a zstd bomb: a small body whose frames would be 1 MiB decompressed: 413 past the cap of decoded bytes
    # (QUEEN_MAX_DECODED_BYTES, by default the body limit)
    bomb = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(
        _frame(payload=b'"' + b"a" * (1 << 20) + b'"')
    )
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.post("/api/v1/push", content=_frames_body("h", "p", [_frame()], z=bomb), headers=PUSH_TYPE)
        assert r.status_code == 413 and r.json()["code"] == "decoded_too_large", r.text
        big = encode_push_frames([PushBatch("h", "p", [b'"' + os.urandom(40_000).hex().encode() + b'"'])])
        r = await http.post("/api/v1/push", content=big, headers=PUSH_TYPE)
        assert r.status_code == 413, r.text
        long_name = encode_push_frames([PushBatch("q" * 300, "p", [b"1"])])
        r = await http.post("/api/v1/push", content=long_name, headers=PUSH_TYPE)
        assert r.status_code == 413 and r.json()["code"] == "name_too_long", r.text
        bad_head = encode_transaction_frames(b"{not json", [PushBatch("h", "p", [b"1"], ["a"])])
        r = await http.post("/api/v1/transaction", content=bad_head, headers=PUSH_TYPE)
        assert r.status_code == 400 and r.json()["code"] == "bad_json", r.text
        cut = encode_transaction_frames(b"{}", [PushBatch("h", "p", [b"1"], ["a"])])[:-3]
        r = await http.post("/api/v1/transaction", content=cut, headers=PUSH_TYPE)
        assert r.status_code == 400 and r.json()["code"] == "bad_binary" and r.json()["offset"] > 0, r.text
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 0


async def test_a_zstd_bomb_in_a_compressed_body_is_refused_without_inflating_it(start_broker: Any, conn: Any) -> None:
    """Regression: flag 1 (the whole body zstd) decompressed everything before comparing with the
    declared raw length: 32 KiB of zstd (1 GiB of zeros, no declared size) took 1 GiB of memory."""
    broker = await start_broker()
    z = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    chunk = bytes(1 << 20)
    bomb = b"".join(z.compress(chunk) for _ in range(1024)) + z.flush()
    body = b"QPB1" + bytes([1]) + (100).to_bytes(4, "little") + bomb  # flags=1, raw length 100
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)
    assert r.status_code == 400 and r.json()["code"] == "bad_binary", r.text
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256, f"the broker inflated the bomb: peak RSS grew {grown_mib:.0f} MiB"
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 0
