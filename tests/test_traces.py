"""Traces over real HTTP: record, a message's timeline, by name, the names; errors; retention (time
passed into the procedure, leadership by TRACES_RETENTION_LOCK); and the official client's
``message["trace"](...)`` in a consume handler (queen-mq 2.6.0)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from queen_pg.db.locks import TRACES_RETENTION_LOCK
from tests.conftest import Broker
from tests.helpers import assert_error, push

T = "/api/v1/traces"


async def trace(http: httpx.AsyncClient, **body: Any) -> Any:
    r = await http.post(T, json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def test_record_and_read_a_timeline(http: httpx.AsyncClient) -> None:
    pid = (await push(http, "tq", [{"payload": 1, "transactionId": "m1"}]))[0]["partitionId"]
    first = await trace(
        http, transactionId="m1", partitionId=pid, consumerGroup="g", traceNames=["order-7"], data={"step": 1}
    )
    assert first["success"] is True and isinstance(first["id"], int) and first["createdAt"].endswith("Z")
    await trace(
        http,
        transactionId="m1",
        partitionId=int(pid),
        traceNames=["order-7", "vip"],
        eventType="error",
        data={"step": 2},
    )
    await trace(http, transactionId="m1", partitionId=pid, traceNames=None, data="plain")
    await trace(http, transactionId="other", partitionId=pid, traceName="vip", data=None)

    r = await http.get(f"{T}/{pid}/m1")
    assert r.status_code == 200, r.text
    tl = r.json()
    assert tl["total"] == 3 and tl["queue"] == "tq" and tl["partition"] == "Default" and tl["transactionId"] == "m1"
    assert [t["data"] for t in tl["traces"]] == [{"step": 1}, {"step": 2}, "plain"]  # oldest first
    t0, t1, t2 = tl["traces"]
    assert t0["consumerGroup"] == "g" and t0["queueMode"] is False and t0["eventType"] == "info"
    assert t1["consumerGroup"] is None and t1["queueMode"] is True and t1["eventType"] == "error"
    assert t1["traceNames"] == ["order-7", "vip"] and t2["traceNames"] == []
    page = (await http.get(f"{T}/{pid}/m1", params={"limit": 1, "offset": 2})).json()
    assert page["total"] == 3 and [t["data"] for t in page["traces"]] == ["plain"]
    assert (await http.get(f"{T}/{pid}/never-traced")).json()["traces"] == []

    names = (await http.get(f"{T}/names")).json()
    assert names["total"] == 2
    assert [(n["name"], n["count"]) for n in names["names"]] == [("order-7", 2), ("vip", 2)]
    assert [n["name"] for n in (await http.get(f"{T}/names", params={"search": "VI"})).json()["names"]] == ["vip"]

    vip = (await http.get(f"{T}/by-name/vip")).json()
    assert vip["traceName"] == "vip" and vip["total"] == 2
    assert [t["transactionId"] for t in vip["traces"]] == ["other", "m1"]  # newest first
    assert vip["traces"][0]["queue"] == "tq" and vip["traces"][0]["partitionId"] == pid
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert (await http.get(f"{T}/by-name/vip", params={"from": later})).json()["total"] == 0
    assert (await http.get(f"{T}/by-name/vip", params={"to": later})).json()["total"] == 2
    assert (await http.get(f"{T}/by-name/unknown")).json() == {
        "traceName": "unknown",
        "total": 0,
        "limit": 100,
        "offset": 0,
        "traces": [],
    }


async def test_trace_data_jsonb_refuses_is_kept_as_text(http: httpx.AsyncClient) -> None:
    pid = (await push(http, "nul", [{"payload": 1, "transactionId": "m"}]))[0]["partitionId"]
    await trace(http, transactionId="m", partitionId=pid, data={"s": "a\u0000b"})
    (t,) = (await http.get(f"{T}/{pid}/m")).json()["traces"]
    assert t["data"] == '{"s":"a\\u0000b"}'


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"transactionId": "m", "partitionId": "1"}, 400, "bad_request"),  # no data
        ({"partitionId": "1", "data": {}}, 400, "bad_request"),
        ({"transactionId": "m", "partitionId": "one", "data": {}}, 400, "bad_request"),
        ({"transactionId": "m", "partitionId": "1", "traceNames": "x", "data": {}}, 400, "bad_request"),
        ({"transactionId": "m", "partitionId": "1", "traceNames": [7], "data": {}}, 400, "bad_request"),
        (
            {"transactionId": "m", "partitionId": "1", "traceNames": [f"n{i}" for i in range(40)], "data": {}},
            400,
            "bad_request",
        ),
        ({"transactionId": "m", "partitionId": "1", "traceNames": ["x" * 300], "data": {}}, 413, "name_too_long"),
        ({"transactionId": "m", "partitionId": "1", "eventType": "", "data": {}}, 400, "bad_request"),
        ({"transactionId": "m", "partitionId": "999999", "data": {}}, 404, "not_found"),
    ],
)
async def test_record_errors(http: httpx.AsyncClient, body: dict[str, Any], status: int, code: str) -> None:
    assert_error(await http.post(T, json=body), status, code)


async def test_read_errors(http: httpx.AsyncClient) -> None:
    assert_error(
        await http.post(T, content=b"{not json", headers={"content-type": "application/json"}), 400, "bad_json"
    )
    assert_error(await http.get(f"{T}/999999/m"), 404, "not_found")
    assert_error(await http.get(f"{T}/abc/m"), 400, "bad_request")
    assert_error(await http.get(f"{T}/names", params={"limit": -1}), 400, "bad_request")
    assert_error(await http.get(f"{T}/by-name/vip", params={"from": "soon"}), 400, "bad_request")
    assert_error(await http.get(f"{T}/by-name/" + "x" * 300), 413, "name_too_long")


async def test_retention_and_queue_delete(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    pid = (await push(http, "rt", [{"payload": 1, "transactionId": "m"}]))[0]["partitionId"]
    for i in range(3):
        await trace(http, transactionId="m", partitionId=pid, traceNames=["keep"], data=i)
    in_two_days = datetime.now(UTC) + timedelta(days=2)
    sql = "SELECT queen.traces_retention_v1($1, $2, $3)"
    assert await conn.fetchval(sql, 100, 3 * 86400, in_two_days) == 0  # younger than 3 days
    assert await conn.fetchval(sql, 100, 0, in_two_days) == 0  # 0 = kept forever
    assert await conn.fetchval(sql, 2, 86400, in_two_days) == 2  # bounded: oldest first
    assert (await http.get(f"{T}/{pid}/m")).json()["total"] == 1
    assert await conn.fetchval("SELECT count(*) FROM queen.trace_names") == 1  # names went with them
    assert (await http.delete("/api/v1/resources/queues/rt")).json()["deleted"] is True
    assert await conn.fetchval("SELECT count(*) FROM queen.traces") == 0


async def test_retention_yields_to_its_lock(db_url: str, conn: asyncpg.Connection) -> None:
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT pg_advisory_xact_lock($1)", TRACES_RETENTION_LOCK)
            assert await conn.fetchval("SELECT queen.traces_retention_v1(10, 1, NULL)") == 0
    finally:
        await holder.close()


async def test_official_client_traces_from_a_consume_handler(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("traced").create()
        pushed = await client.queue("traced").push([{"data": {"i": i}, "transactionId": f"tr-{i}"} for i in range(2)])
        answers: list[Any] = []

        async def handle(m: dict[str, Any]) -> None:
            # one message per call: the client's trace() closes over its loop variable, so in a batch
            # every message's trace() would name the batch's last message
            answers.append(await m["trace"]({"traceName": ["checkout", "vip"], "data": {"seen": m["data"]["i"]}}))

        await client.queue("traced").group("workers").batch(1).limit(2).consume(handle)
        assert [a["success"] for a in answers] == [True, True] and all("id" in a for a in answers)
        pid = pushed[0]["partitionId"]
        timeline = await client.admin.get_traces_for_message(pid, "tr-1")
        (only,) = timeline["traces"]
        assert only["data"] == {"seen": 1} and only["consumerGroup"] == "workers"
        assert only["traceNames"] == ["checkout", "vip"]
        names = await client.admin.get_trace_names()
        assert [n["name"] for n in names["names"]] == ["checkout", "vip"]
        by_name = await client.admin.get_traces_by_name("checkout", limit=1)
        assert by_name["total"] == 2 and len(by_name["traces"]) == 1
