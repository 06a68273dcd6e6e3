"""Free-form JSON fields of a big JSON body are not built into Python objects (api/shared/raw_fields.py).

A push's ``payload``, a KV ``value``, a trace's ``data`` were decoded to objects: 25-30 bytes per byte
of ``[{},{},...]`` (a 16 MiB JSON push with one such payload took 388 MiB and 3.5 s). A body of 1 MiB
or more now reads them as views of the body: replayed against a real ``queen-pg serve`` process, each
request adds at most GROWTH to its peak RSS. The small fields of a big body are stored byte for byte
as a small body's, and a bad field gets the answer it gets in a small body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson

from queen_pg.api.shared.raw_fields import BIG_BODY
from queen_pg.settings import MIB
from tests.helpers import pop, push
from tests.serve_process import ServeProcess
from tests.test_attack_items import GROWTH, empty_objects
from tests.test_encryption import frames

JSON = {"content-type": "application/json"}


def put(key: str, value: bytes) -> bytes:
    return b'{"op":"put","ns":"raw","key":"' + key.encode() + b'","forever":true,"value":' + value + b"}"


async def test_big_free_form_fields_are_not_built(db_url: str, conn: asyncpg.Connection, tmp_path: Path) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=120) as http:
            pid = (await push(http, "warm", [{"payload": {"n": 1}, "transactionId": "m"}]))[0]["partitionId"]
            r = await http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "raw", "key": "w"}]})
            assert r.status_code == 200, r.text
            baseline = broker.peak_kib() * 1024
            bomb = empty_objects(16 * MIB)

            def grown(what: str) -> None:
                growth = broker.peak_kib() * 1024 - baseline
                assert growth <= GROWTH, f"{what}: peak RSS grew {growth / MIB:.0f} MiB"

            body = b'{"items":[{"queue":"raw","payload":' + bomb + b"}]}"
            r = await http.post("/api/v1/push", content=body, headers=JSON)
            assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text[:300]
            grown("JSON push")

            body = b'{"operations":[{"type":"push","items":[{"queue":"raw","data":' + bomb + b"}]}]}"
            r = await http.post("/api/v1/transaction", content=body, headers=JSON)
            assert r.status_code == 200 and r.json()["success"] is True, r.text[:300]
            grown("transaction push")

            # 60 values of 1 MiB (the most a key holds), the last op refused after the body is read: nothing
            # written (PostgreSQL would take a while to parse 60 MiB of jsonb), then 3 of them written
            value = empty_objects(MIB)
            puts = [put(f"k{i}", value) for i in range(60)]
            bad = b'{"op":"put","ns":"Raw","key":"k","forever":true,"value":1}'
            for path, field in (("/api/v1/kv", b"operations"), ("/api/v1/transaction", b"kv")):
                body = b'{"' + field + b'":[' + b",".join(puts) + b"," + bad + b"]}"
                r = await http.post(path, content=body, headers=JSON)
                assert r.status_code == 400 and "is not a namespace" in r.text, r.text[:300]
                grown(f"{path} of 60 values")
            r = await http.post("/api/v1/kv", content=b'{"operations":[' + b",".join(puts[:3]) + b"]}", headers=JSON)
            assert r.status_code == 200 and all(x["applied"] for x in r.json()["results"]), r.text[:300]
            body = b'{"kv":[' + b",".join(puts[3:6]) + b"]}"
            r = await http.post("/api/v1/transaction", content=body, headers=JSON)
            assert r.status_code == 200 and r.json()["success"] is True, r.text[:300]
            grown("KV values written")

            head = b'{"transactionId":"m","partitionId":"' + pid.encode() + b'","data":'
            r = await http.post("/api/v1/traces", content=head + bomb + b"}", headers=JSON)
            assert r.status_code == 201, r.text[:300]
            grown("trace")

            # an unknown queue option (kept as given), refused at its last byte: U+0000 cannot be stored
            options = b'{"queue":"raw","options":{"x":' + bomb[:-1] + b',"\\u0000"]}}'
            r = await http.post("/api/v1/configure", content=options, headers=JSON)
            assert r.status_code == 400 and "U+0000" in r.json()["error"], r.text[:300]
            grown("configure")

            stored = await frames(conn, "raw")
            assert [f.payload for f in stored] == [bomb, bomb]  # no whitespace to drop: as sent
            values = await conn.fetch("SELECT value::text FROM queen.kv WHERE ns = 'raw' ORDER BY key")
            assert [orjson.loads(v["value"]) == [{}] * (len(value) // 3) for v in values] == [True] * 6
    finally:
        broker.kill()


# Payloads whose written-back form differs from what was sent (numbers, escapes, spaces, big integers).
SMALL_PAYLOADS = [
    b"[1, 2.50, 1E2, -0.0, 1e-7, 18446744073709551615, -9223372036854775808]",
    b'{"a" : "\\u00e9\\/\\ud83d\\ude00", "b" : [ true , false , null ], "\\u0000": "\\u0000"}',
    b'"caf\xc3\xa9"',
    b"12345678901234567890",
    b'{"k":' + b"[" * 200 + b"]" * 200 + b"}",
]


def padded(items: list[bytes], size: int) -> bytes:
    """A push body of ``items`` then one item padding it to exactly ``size`` bytes."""
    head = b'{"items":[' + b",".join(items) + b',{"queue":"pad","payload":"'
    return head + b"x" * (size - len(head) - 4) + b'"}]}'


async def test_small_fields_of_a_big_body_are_stored_as_a_small_bodys(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    items = [b'{"queue":"q","payload":' + p + b"}" for p in SMALL_PAYLOADS]
    for queue, size in (("under", BIG_BODY - 1), ("over", BIG_BODY)):
        body = padded([i.replace(b'"q"', b'"' + queue.encode() + b'"') for i in items], size)
        assert len(body) == size
        r = await http.post("/api/v1/push", content=body, headers=JSON)
        assert r.status_code == 201, r.text[:300]
    under, over = await frames(conn, "under"), await frames(conn, "over")
    written_back = [orjson.dumps(orjson.loads(p)) for p in SMALL_PAYLOADS]
    assert [f.payload for f in over] == [f.payload for f in under] == written_back
    assert all(w != s for w, s in zip(written_back[:2], SMALL_PAYLOADS, strict=False))  # written otherwise than sent

    # a big payload of a big body: stored without its whitespace, popped as sent
    sent: Any = {"rows": [{"n": i, "x": 1.5, "s": "caf\u00e9 \u00e9t\u00e9", "l": [None, True]} for i in range(20_000)]}
    pretty = orjson.dumps(sent, option=orjson.OPT_INDENT_2)
    assert len(pretty) >= BIG_BODY
    r = await http.post("/api/v1/push", content=b'{"items":[{"queue":"big","payload":' + pretty + b"}]}", headers=JSON)
    assert r.status_code == 201, r.text[:300]
    (frame,) = await frames(conn, "big")
    assert frame.payload == orjson.dumps(sent)  # compact; nothing here that orjson writes otherwise
    popped = await pop(http, "big")
    assert popped["messages"][0]["data"] == sent


async def test_a_bad_field_in_a_big_body_is_answered_as_in_a_small_body(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    pid = (await push(http, "t", [{"payload": 1, "transactionId": "m"}]))[0]["partitionId"]
    many = empty_objects(100 * 1024)[:-1]  # a field of 64 KiB or more: checked without being built
    bad = {
        "infinite": b'{"a":[1,{"b":[2,-1e999]}]}',
        "infinite itself": b"1e400",
        "infinite, big": many + b',{"a":[1,{"b":[2,1E+0309]}]}]',
        "integer": b'[1,{"a":18446744073709551616}]',
        "integer, big": many + b",-9223372036854775809]",
        "deep": b"[" * 300 + b"]" * 300,
        "deep, big": many + b"," + b"[" * 300 + b"]" * 300 + b"]",
        "utf-8": b'["\xed\xa0\x80"]',
        "utf-8, big": many + b',"\xff"]',
        "nul": b'{"\\u0000":1}',
        "nul, big": many + b',"a\\u0000"]',
    }
    pad = b'"' + b"x" * BIG_BODY + b'"'

    def bodies(field: bytes) -> dict[str, tuple[str, bytes]]:
        item = b'{"queue":"bad","payload":' + field + b"}"
        pad_item = b'{"queue":"bad","payload":' + pad + b"}"
        kv_pad = put("pad", b'"' + b"x" * (BIG_BODY - 100) + b'"')
        trace = b'{"transactionId":"m","partitionId":"' + pid.encode() + b'","data":'
        return {
            "push": ("/api/v1/push", b'{"items":[' + item + b"]}", b'{"items":[' + item + b"," + pad_item + b"]}"),
            "transaction": (
                "/api/v1/transaction",
                b'{"operations":[{"type":"push","items":[' + item + b"]}]}",
                b'{"operations":[{"type":"push","items":[' + item + b"]},{\"type\":\"push\",\"items\":[" + pad_item
                + b"]}]}",
            ),
            "kv": ("/api/v1/kv", b'{"operations":[' + put("k", field) + b"]}",
                   b'{"operations":[' + put("k", field) + b"," + kv_pad + b"]}"),
            "transaction kv": ("/api/v1/transaction", b'{"kv":[' + put("k", field) + b"]}",
                               b'{"kv":[' + put("k", field) + b"," + kv_pad + b"]}"),
            "trace": ("/api/v1/traces", trace + field + b"}", trace + field + b',"pad":' + pad + b"}"),
            "configure": ("/api/v1/configure", b'{"queue":"cfg","options":{"x":' + field + b"}}",
                          b'{"queue":"cfg","options":{"x":' + field + b',"pad":' + pad + b"}}"),
        }  # fmt: skip

    refused = 0
    for kind, field in bad.items():
        for route, (path, small, big) in bodies(field).items():
            assert len(small) < BIG_BODY <= len(big)
            a = await http.post(path, content=small, headers=JSON)
            b = await http.post(path, content=big, headers=JSON)
            if a.status_code >= 400:
                assert (b.status_code, b.json()) == (a.status_code, a.json()), (kind, route, a.text, b.text[:300])
                assert a.json()["code"] in ("bad_request", "bad_json", "kv_bad_request"), a.text
                refused += 1
            else:
                assert b.status_code == a.status_code, (kind, route, b.text[:300])
    assert refused == 11 * 6 - 2 * 3  # all but U+0000 in a pushed payload or a trace's data (stored there)
    assert await conn.fetchval("SELECT count(*) FROM queen.kv WHERE ns = 'raw'") == 0
    pushed = [f.payload for f in await frames(conn, "bad")]
    assert pushed == [x for k in ("nul", "nul, big") for x in [bad[k], bad[k], pad] * 2]  # push, transaction
