"""POST /api/v1/push over real HTTP: results per item, creation on first push, dedup, bad input."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.helpers import EMPTY, counts, push


async def test_first_push_creates_queue_and_partition_with_results_in_order(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    res = await push(http, "orders", [{"payload": {"n": i}, "transactionId": f"t{i}"} for i in range(3)], "p1")
    assert [r["status"] for r in res] == ["queued"] * 3
    assert [r["transactionId"] for r in res] == ["t0", "t1", "t2"]
    assert [r["offset"] for r in res] == [0, 1, 2]
    assert len({r["messageId"] for r in res}) == 3
    assert {r["partitionId"] for r in res} == {res[0]["partitionId"]}
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'orders'") == 1
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions WHERE name = 'p1'") == 3


async def test_hundred_items_make_one_segment_row(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "bulk", [{"payload": {"i": i}} for i in range(100)])
    rows = await conn.fetch("SELECT base_offset, end_offset, dropped FROM queen.log_segments")
    assert [(r["base_offset"], r["end_offset"], r["dropped"]) for r in rows] == [(0, 100, None)]
    assert await conn.fetchval("SELECT count(*) FROM queen.log_txns") == 100


async def test_offsets_are_gapless_across_pushes_and_partitions(http: httpx.AsyncClient) -> None:
    a = await push(http, "q", [{"payload": 1}, {"payload": 2}], "a")
    b = await push(http, "q", [{"payload": 3}], "b")
    a2 = await push(http, "q", [{"payload": 4}], "a")
    assert [r["offset"] for r in a + a2] == [0, 1, 2]
    assert b[0]["offset"] == 0
    assert a[0]["partitionId"] != b[0]["partitionId"]


async def test_duplicate_transaction_id_answers_original_and_writes_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    first = await push(http, "q", [{"payload": {"v": 1}, "transactionId": "same"}])
    before = await counts(conn)
    again = await push(http, "q", [{"payload": {"v": 2}, "transactionId": "same"}])
    assert again[0]["status"] == "duplicate"
    assert again[0]["messageId"] == first[0]["messageId"]
    assert again[0]["offset"] == first[0]["offset"]
    assert await counts(conn) == before
    # the same id in another partition is a different message
    other = await push(http, "q", [{"payload": {"v": 3}, "transactionId": "same"}], "other")
    assert other[0]["status"] == "queued"


async def test_duplicates_inside_one_request_keep_offsets_gapless(http: httpx.AsyncClient) -> None:
    res = await push(
        http,
        "q",
        [
            {"payload": 1, "transactionId": "x"},
            {"payload": 2, "transactionId": "x"},
            {"payload": 3, "transactionId": "y"},
        ],
    )
    assert [r["status"] for r in res] == ["queued", "duplicate", "queued"]
    assert res[1]["messageId"] == res[0]["messageId"]
    assert [res[0]["offset"], res[2]["offset"]] == [0, 1]
    popped = (await http.get("/api/v1/pop/queue/q", params={"batch": 10})).json()
    assert [m["data"] for m in popped["messages"]] == [1, 3]
    assert [m["offset"] for m in popped["messages"]] == [0, 1]


async def test_mixed_new_and_stored_duplicates_in_one_request(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": "a", "transactionId": "a"}])
    res = await push(
        http,
        "q",
        [
            {"payload": "b", "transactionId": "b"},
            {"payload": "a2", "transactionId": "a"},
            {"payload": "c", "transactionId": "c"},
        ],
    )
    assert [r["status"] for r in res] == ["queued", "duplicate", "queued"]
    assert [r["offset"] for r in res] == [1, 0, 2]
    popped = (await http.get("/api/v1/pop/queue/q", params={"batch": 10})).json()
    assert [m["data"] for m in popped["messages"]] == ["a", "b", "c"]


async def test_payload_forms_round_trip(http: httpx.AsyncClient) -> None:
    values = [None, 0, "text", [1, {"x": "ü"}], {"nested": {"deep": True}}]
    await push(http, "q", [{"payload": v} for v in values])
    popped = (await http.get("/api/v1/pop/queue/q", params={"batch": 10})).json()
    assert [m["data"] for m in popped["messages"]] == values


async def test_push_without_transaction_id_uses_message_id(http: httpx.AsyncClient) -> None:
    res = await push(http, "q", [{"payload": 1}])
    assert res[0]["transactionId"] == res[0]["messageId"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "bad_json"),
        (b"", "bad_request"),
        (b"[]", "bad_request"),
        (b'{"items": []}', "bad_request"),
        (b'{"items": "x"}', "bad_request"),
        (b'{"items": [{"payload": 1}]}', "bad_request"),
        (b'{"items": [{"queue": 5, "payload": 1}]}', "bad_request"),
        (b'{"items": [{"queue": "q", "partition": 7}]}', "bad_request"),
        (b'{"items": [{"queue": "q", "transactionId": 12}]}', "bad_request"),
        (b'{"items": [{"queue": "q", "transactionId": ""}]}', "bad_request"),
        (b'{"items": [{"queue": ""}]}', "bad_request"),
        (b'{"items": [{"queue": "q", "traceId": "not-a-uuid"}]}', "bad_request"),
        (b'{"items": [{"queue": "ok"}, {"queue": null}]}', "bad_request"),
    ],
)
async def test_bad_push_is_400_and_writes_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, body: bytes, code: str
) -> None:
    r = await http.post("/api/v1/push", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == code
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert await counts(conn) == EMPTY


@pytest.mark.parametrize("field", ["queue", "partition"])
async def test_name_over_255_bytes_is_413(http: httpx.AsyncClient, conn: asyncpg.Connection, field: str) -> None:
    item = {"queue": "q", "partition": "p", "payload": 1}
    item[field] = "é" * 128  # 256 bytes
    r = await http.post("/api/v1/push", json={"items": [item]})
    assert r.status_code == 413
    assert r.json()["code"] == "name_too_long"
    assert await counts(conn) == EMPTY
    item[field] = "e" * 255
    assert (await http.post("/api/v1/push", json={"items": [item]})).status_code == 201


async def test_body_over_limit_is_413_before_reading(start_broker, conn: asyncpg.Connection) -> None:  # type: ignore[no-untyped-def]
    b = await start_broker(max_body_bytes=4096)
    async with httpx.AsyncClient(base_url=b.url) as client:
        big = {"items": [{"queue": "q", "payload": "x" * 5000}]}
        r = await client.post("/api/v1/push", json=big)
        assert r.status_code == 413
        assert r.json()["code"] == "body_too_large"

        async def chunks():  # type: ignore[no-untyped-def]
            yield b'{"items": [{"queue": "q", "payload": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}]}'

        r = await client.post("/api/v1/push", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert r.json()["code"] == "body_too_large"
        small = await client.post("/api/v1/push", json={"items": [{"queue": "q", "payload": "x" * 100}]})
        assert small.status_code == 201
    c = await counts(conn)
    assert c["log_txns"] == 1
