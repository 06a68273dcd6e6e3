"""A request's memory is bounded by a constant times what it declares, replayed against a real
``queen-pg serve`` process (its peak RSS read from /proc).

Items: a push, binary push, /ack/batch or transaction carrying more than QUEEN_MAX_ITEMS items is
413 ``too_many_items`` naming the limit, counted before any item is built, and writes nothing (a 5 MB
push of 200,000 tiny items took a worker from 77 MB to 1,174 MB before). A push of exactly the limit
works, and its answer (one result per item) stays within a bound per item.

Payloads turned into objects: a JSON check builds 25-30 bytes of Python objects per byte of
``[{},{},...]``; a 3 KB /timers request whose zstd payload is 24 MiB of it added 620 MB, a 1.4 KB
binary push carrying one 16 MiB payload 475 MB. A big payload is now checked without being built.
"""

from __future__ import annotations

import base64
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest
import zstandard
from queen.http.push_binary import PushBatch, encode_push_binary, encode_push_frames, encode_transaction_frames

from queen_pg.engine import json_check
from queen_pg.settings import MIB
from tests.conftest import Broker, PgServer, broker_settings, fresh_database
from tests.helpers import eventually
from tests.serve_process import ServeProcess
from tests.test_hot_protocol import Wire, json_request, request

CAP = 10_000  # QUEEN_MAX_ITEMS's default
MANY = 200_000
GROWTH = 150 * MIB  # the most a replayed attack may add to the worker's peak RSS
JSON = {"content-type": "application/json"}
PUSH_TYPE = {"content-type": "application/x-queen-push"}
ITEM = {"queue": "attack", "payload": 0}
ACK = {"transactionId": "x", "partitionId": "1", "consumerGroup": "g"}


async def written(conn: asyncpg.Connection) -> tuple[int, int, int]:
    segments = await conn.fetchval("SELECT count(*) FROM queen.log_segments")
    queues = await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'attack'")
    timers = await conn.fetchval("SELECT count(*) FROM queen.timers")
    return int(segments), int(queues), int(timers)


async def warm(http: httpx.AsyncClient) -> None:
    """One request of each kind, so the baseline holds what serving them costs."""
    r = await http.post("/api/v1/push", json={"items": [{"queue": "warm", "payload": {"n": i}} for i in range(100)]})
    assert r.status_code == 201, r.text
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ACK]})
    assert r.status_code == 200, r.text
    r = await http.post("/api/v1/transaction", json={"operations": [{"type": "ack", **ACK}]})
    assert r.status_code == 200, r.text
    body = encode_push_binary([PushBatch("warm", "p", [b'{"a":1}'])], compress=True)
    assert (await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)).status_code == 201


def too_many() -> dict[str, tuple[str, dict[str, str], bytes]]:
    """name -> (path, headers, body): each carries far more than CAP items, each body under 16 MiB."""
    payloads = [b"0"] * MANY
    return {
        "JSON push": ("/api/v1/push", JSON, orjson.dumps({"items": [ITEM] * MANY})),
        "binary push": ("/api/v1/push", PUSH_TYPE, encode_push_binary([PushBatch("attack", "p", payloads)])),
        "zstd binary push": (
            "/api/v1/push",
            PUSH_TYPE,
            encode_push_binary([PushBatch("attack", "p", payloads)], compress=True),
        ),
        "framed binary push": ("/api/v1/push", PUSH_TYPE, encode_push_frames([PushBatch("attack", "p", payloads)])),
        "ack batch": ("/api/v1/ack/batch", JSON, orjson.dumps({"acknowledgments": [ACK] * MANY})),
        "transaction of acks": (
            "/api/v1/transaction",
            JSON,
            orjson.dumps({"operations": [{"type": "ack", **ACK}] * MANY}),
        ),
        "transaction pushing": (
            "/api/v1/transaction",
            JSON,
            orjson.dumps({"operations": [{"type": "push", "items": [ITEM] * MANY}]}),
        ),
        "transaction of many pushes": (
            "/api/v1/transaction",
            JSON,
            orjson.dumps({"operations": [{"type": "push", "items": [ITEM] * 2}] * (MANY // 2)}),
        ),
        "binary transaction": (
            "/api/v1/transaction",
            PUSH_TYPE,
            encode_transaction_frames(b"{}", [PushBatch("attack", "p", payloads)]),
        ),
        "binary transaction, head and frames": (
            "/api/v1/transaction",
            PUSH_TYPE,
            encode_transaction_frames(
                orjson.dumps({"operations": [{"type": "ack", **ACK}] * (CAP // 2 + 1)}),
                [PushBatch("attack", "p", [b"0"] * (CAP // 2))],
            ),
        ),
    }


async def test_too_many_items_are_413_before_they_are_built(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
            await warm(http)
            before = await written(conn)
            baseline = broker.peak_kib() * 1024
            for name, (path, headers, body) in too_many().items():
                assert len(body) < 16 * MIB, (name, len(body))
                r = await http.post(path, content=body, headers=headers)
                assert r.status_code == 413, (name, r.status_code, r.text[:300])
                assert r.json()["code"] == "too_many_items", (name, r.text[:300])
                assert f"at most {CAP} items (QUEEN_MAX_ITEMS)" in r.json()["error"], (name, r.text[:300])
                grown = broker.peak_kib() * 1024 - baseline
                assert grown <= GROWTH, f"{name}: peak RSS grew {grown / MIB:.0f} MiB"
                assert await written(conn) == before, name

            # the KV, locks and timers families keep their own op limits, now counted before the ops are built
            for path, op in (
                ("/api/v1/timers", {"op": "cancel", "queue": "attack", "timerKey": "k"}),
                ("/api/v1/kv", {"op": "get", "ns": "attack", "key": "k"}),
                ("/api/v1/locks", {"op": "get", "name": "attack"}),
            ):
                r = await http.post(path, content=orjson.dumps({"operations": [op] * MANY}), headers=JSON)
                assert r.status_code == 400 and r.json()["reason"] == "too_many_ops", (path, r.text[:300])
                assert "operations: Expected `array` of length <=" in r.json()["detail"], (path, r.text[:300])
                grown = broker.peak_kib() * 1024 - baseline
                assert grown <= GROWTH, f"{path}: peak RSS grew {grown / MIB:.0f} MiB"
            assert await written(conn) == before

            # exactly the limit works, JSON and binary; the answer is one result per item, within a bound
            r = await http.post("/api/v1/push", json={"items": [ITEM] * CAP})
            assert r.status_code == 201, r.text[:300]
            results = r.json()
            assert len(results) == CAP and all(x["status"] == "queued" for x in results)
            assert len(r.content) <= CAP * 256, len(r.content)  # ~190 bytes + names + transactionId per item
            body = encode_push_binary([PushBatch("attack", "b", [b"0"] * CAP)], compress=True)
            r = await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)
            assert r.status_code == 201 and len(r.json()) == CAP, r.text[:300]
            r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ACK] * CAP})
            assert r.status_code == 200 and len(r.json()) == CAP, r.text[:300]
            stored = "SELECT sum(p.next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
            assert await conn.fetchval(stored + " WHERE q.name = 'attack'") == 2 * CAP
    finally:
        broker.kill()


async def test_items_hold_admission_budget_not_only_their_bytes(pg_server: PgServer) -> None:
    """A push of 10,000 tiny items (254 KB) is charged ITEM_COST per item (up to one largest body), not its
    Content-Length: with the 2 MiB budget held but for 960 KiB it is 429 ``overloaded``; 100 items pass."""
    settings = broker_settings(fresh_database(pg_server), max_body_bytes=MIB, admit_max_mb=2, admit_hold_ms=50)
    broker = Broker(settings)
    await broker.start()
    holders = [await Wire.open(broker) for _ in range(2)]
    wire = await Wire.open(broker)
    try:
        for w, size in zip(holders, (MIB, 64 * 1024), strict=True):  # heads whose bodies never come
            w.writer.write(request("POST", "/api/v1/push")[: -len(b"content-length: 0\r\n\r\n")])
            w.writer.write(b"content-length: %d\r\n\r\n" % size)
            await w.writer.drain()
        budget = broker.app.state.queen.admission
        await eventually(lambda: budget.sem.used >= MIB + 64 * 1024, "the heads to hold their bytes")
        ((status, _, answer),) = await wire.ask(json_request("POST", "/api/v1/push", {"items": [ITEM] * CAP}))
        assert status.split(b" ")[1] == b"429" and answer["code"] == "overloaded", (status, answer)
        ((status, _, answer),) = await wire.ask(json_request("POST", "/api/v1/push", {"items": [ITEM] * 100}))
        assert status.split(b" ")[1] == b"201" and len(answer) == 100, (status, answer)
        assert budget.sem.used == MIB + 64 * 1024  # the charges went back
    finally:
        for w in (*holders, wire):
            await w.close()
        await broker.stop()


def empty_objects(size: int) -> bytes:
    """``[{},{},...]`` of ``size`` bytes: valid JSON, 3 bytes per object (~64 bytes each once built)."""
    n = (size - 1) // 3
    return b"[" + b"{}," * (n - 1) + b"{}]"


async def test_payloads_of_many_objects_are_checked_without_building_them(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
            z = zstandard.ZstdCompressor(level=3)
            small = z.compress(b'{"a":1}')
            op = {"op": "schedule", "queue": "bomb", "delayMs": 3_600_000, "payloadZstd": True}
            warm = {**op, "timerKey": "w", "payload": base64.b64encode(small).decode()}
            r = await http.post("/api/v1/timers", json={"operations": [warm]})
            assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text
            body = encode_push_binary([PushBatch("warm", "p", [b'{"a":1}'])], compress=True)
            assert (await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)).status_code == 201
            baseline = broker.peak_kib() * 1024

            # /timers: a 24 MiB zstd payload of [{},...] one byte short of JSON: refused as not_json
            bad = base64.b64encode(z.compress(empty_objects(24 * MIB)[:-1])).decode()
            r = await http.post("/api/v1/timers", json={"operations": [{**op, "timerKey": "c", "payload": bad}]})
            assert len(r.request.content) < 8 * 1024
            assert r.status_code == 400 and r.json()["reason"] == "not_json", r.text[:300]
            grown = broker.peak_kib() * 1024 - baseline
            assert grown <= GROWTH, f"timers (not JSON): peak RSS grew {grown / MIB:.0f} MiB"

            # the same as valid JSON: scheduled (the 24 MiB payload is written to PostgreSQL)
            bomb = base64.b64encode(z.compress(empty_objects(24 * MIB))).decode()
            r = await http.post("/api/v1/timers", json={"operations": [{**op, "timerKey": "b", "payload": bomb}]})
            assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text[:300]
            grown = broker.peak_kib() * 1024 - baseline
            assert grown <= GROWTH, f"timers: peak RSS grew {grown / MIB:.0f} MiB"

            # a zstd binary push of one 16 MiB payload of [{},...] (valid JSON: stored)
            body = encode_push_binary([PushBatch("bomb", "p", [empty_objects(16 * MIB)])], compress=True)
            assert len(body) < 4 * 1024
            r = await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)
            assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text[:300]
            grown = broker.peak_kib() * 1024 - baseline
            assert grown <= GROWTH, f"binary push: peak RSS grew {grown / MIB:.0f} MiB"
            assert await conn.fetchval("SELECT count(*) FROM queen.timers WHERE queue = 'bomb'") == 2
    finally:
        broker.kill()


# --- the check without building: decides as building does ----------------------------------------

_ATOMS = [b"0", b"-0", b"1.5", b"1e5", b"1E+5", b"1e-400", b"1e308", b"1e309", b"-1e999", b"1e0309", b"1E+0309",
          b"1.7976931348623157e308", b"1.7976931348623159e308", b"18446744073709551615", b"18446744073709551616",
          b"-9223372036854775808", b"-9223372036854775809", b"12345678901234567890123", b"0.12345678901234567890123",
          b"1e1234567890123456789012", b"1" * 310 + b".5", b"1" * 310, b"1" * 300 + b"e9", b"1" * 250 + b".5e60",
          b"1" * 250 + b"e-58", b"true", b"false", b"null", b'""', b'"a"', b'"\\u0000"', b'"\\\\u0000"',
          b'"\\ud800\\udc00"', b'"\\ud800"', b'"\\udc00"', b'"\xc3\xa9"', b'"\xff"', b'"\xed\xa0\x80"', b'"[[[{"',
          b'"12345678901234567890123"', b'"1e999"', b'"\\""', b'"\\\\"', b'"a\\\\\\"b\\\\"', b'"\x7f"', b'"\x01"',
          b"NaN", b"01", b"1.", b"+1", b'"\\x"']  # fmt: skip


def _documents(rnd: random.Random, n: int) -> list[bytes]:
    def value(depth: int) -> bytes:
        r = rnd.random()
        if depth > 6 or r < 0.4:
            return rnd.choice(_ATOMS)
        if r < 0.7:
            return b"[" + b",".join(value(depth + 1) for _ in range(rnd.randint(0, 4))) + b"]"
        keys = rnd.sample([b'"k"', b'"\\u0000"', b'"x\\"y["'], rnd.randint(0, 3))  # no duplicate key
        return b"{" + b",".join(k + b":" + value(depth + 1) for k in keys) + b"}"

    def mutated(doc: bytes) -> bytes:
        r = rnd.random()
        if r < 0.1 and doc:
            at = rnd.randrange(len(doc))
            return doc[:at] + doc[at + 1 :]
        if r < 0.15:
            return doc + rnd.choice([b" ", b"x", b",", b"]"])
        return rnd.choice([b"\xef\xbb\xbf", b" "]) + doc if r < 0.2 else doc

    docs = [mutated(value(0)) for _ in range(n)]
    for depth in (253, 254, 255, 1100):
        docs += [b"[" * depth + b"]" * depth, b'[{"a":' * (depth // 2) + b"1" + b"}]" * (depth // 2)]
        docs += [b"[" * depth + b'"]]]]"' + b"]" * depth, b"[" * (depth - 1) + b'{"a":[]}' + b"]" * (depth - 1)]
    return docs


def _verdict(check: Callable[[bytes, bool], None], doc: bytes, nul_ok: bool) -> bool:
    try:
        check(doc, nul_ok)
    except (ValueError, TypeError):
        return False
    return True


def test_the_check_without_building_decides_as_building_does(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _documents(random.Random(7), 4000)
    assert 0.2 < sum(_verdict(json_check._built, d, True) for d in docs) / len(docs) < 0.8  # both kinds
    for steps in ("default", "tiny"):
        if steps == "tiny":  # strings, escapes and numbers across the steps' edges
            monkeypatch.setattr(json_check, "_STRING_STEP", 5)
            monkeypatch.setattr(json_check, "_STEP", 7)
        for doc in docs:
            for nul_ok in (True, False):
                built = _verdict(json_check._built, doc, nul_ok)
                assert _verdict(json_check._scanned, doc, nul_ok) == built, (steps, nul_ok, doc[:200])


def test_a_big_payload_is_checked_with_less_memory_than_its_size() -> None:
    payload = empty_objects(8 * MIB)
    tracemalloc.start()
    try:
        json_check.check(payload, nul_ok=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(payload), peak  # building it took ~25 x its size
    with pytest.raises(ValueError):
        json_check.check(payload[:-1], nul_ok=True)
