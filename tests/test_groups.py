"""Consumer-group administration over real HTTP: list, inspect, delete, seek, subscription; and the
official client's calls (queen-mq 2.6.0)."""

from __future__ import annotations

from datetime import timedelta, timezone
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import assert_error, pop, push

GROUPS = "/api/v1/consumer-groups"


def seek_url(group: str, queue: str, partition: str | None = None) -> str:
    return f"{GROUPS}/{group}/queues/{queue}" + (f"/partitions/{partition}" if partition else "") + "/seek"


async def drain(http: httpx.AsyncClient, queue: str, group: str) -> list[Any]:
    """Pop with auto-ack until the group has nothing left; the data of every message, in order."""
    seen: list[Any] = []
    while (ans := await pop(http, queue, consumerGroup=group, batch=100, autoAck=True)) is not None:
        seen.extend(m["data"] for m in ans["messages"])
    return seen


async def cursors(conn: asyncpg.Connection, group: str) -> dict[str, int]:
    rows = await conn.fetch(
        """SELECT p.name, lc.cursor_offset FROM queen.log_consumers lc
             JOIN queen.log_partitions p ON p.id = lc.partition_id WHERE lc.consumer_group = $1""",
        group,
    )
    return {r["name"]: r["cursor_offset"] for r in rows}


async def test_list_and_get_groups(http: httpx.AsyncClient) -> None:
    await push(http, "q1", [{"payload": i} for i in range(5)], "p1")
    await push(http, "q1", [{"payload": i} for i in range(3)], "p2")
    await push(http, "q2", [{"payload": 0}])
    leased = await pop(http, "q1", consumerGroup="billing", partition="p1", batch=2)
    await pop(http, "q2", autoAck=True)  # queue mode

    r = await http.get(GROUPS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 2 and body["limit"] == 100 and body["offset"] == 0
    by_name = {(g["name"], g["queue"]): g for g in body["consumerGroups"]}
    billing = by_name[("billing", "q1")]
    assert billing["queueMode"] is False and billing["partitions"] == 2
    assert billing["totalLag"] == 8 and billing["leasedPartitions"] == 1
    assert billing["subscriptionMode"] == "all" and billing["subscriptionFrom"] is None
    assert billing["createdAt"].endswith("Z")
    qm = by_name[(None, "q2")]
    assert qm["queueMode"] is True and qm["totalLag"] == 0 and qm["leasedPartitions"] == 0

    page = (await http.get(GROUPS, params={"limit": 1, "offset": 1})).json()
    assert page["total"] == 2 and len(page["consumerGroups"]) == 1
    first = (await http.get(GROUPS, params={"limit": 1})).json()["consumerGroups"]
    assert first != page["consumerGroups"]

    r = await http.get(f"{GROUPS}/billing")
    assert r.status_code == 200, r.text
    detail = r.json()
    assert detail["name"] == "billing" and detail["queueMode"] is False and detail["totalLag"] == 8
    (q1,) = detail["queues"]
    assert q1["queue"] == "q1" and q1["partitionCount"] == 2 and q1["leasedPartitions"] == 1
    p1, p2 = q1["partitions"]
    assert p1["partition"] == "p1" and p1["cursor"] == 0 and p1["nextOffset"] == 5 and p1["lag"] == 5
    assert p1["leaseId"] == leased["leaseId"] and p1["leaseLive"] is True and p1["leaseEnd"] == 2
    assert p1["leaseExpiresAt"].endswith("Z") and p1["deliveryAttempts"] == 1
    assert p1["partitionId"] == leased["partitionId"]
    assert p2["partition"] == "p2" and p2["lag"] == 3 and p2["leaseId"] is None and p2["leaseLive"] is False

    qmode = (await http.get(f"{GROUPS}/__QUEUE_MODE__")).json()
    assert qmode["name"] is None and qmode["queueMode"] is True
    assert [q["queue"] for q in qmode["queues"]] == ["q2"] and qmode["queues"][0]["partitions"][0]["cursor"] == 1


async def test_list_get_bad_input_and_unknown(http: httpx.AsyncClient) -> None:
    assert (await http.get(GROUPS)).json() == {"total": 0, "limit": 100, "offset": 0, "consumerGroups": []}
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"offset": -1}):
        assert_error(await http.get(GROUPS, params=params), 400, "bad_request")
    assert_error(await http.get(f"{GROUPS}/nobody"), 404, "not_found")
    assert_error(await http.get(f"{GROUPS}/{'g' * 256}"), 413, "name_too_long")


async def test_seek_to_end_and_start_breaks_the_live_lease(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": i, "transactionId": f"t{i}"} for i in range(5)])
    held = await pop(http, "q", consumerGroup="g", batch=5)
    assert len(held["messages"]) == 5

    r = await http.post(seek_url("g", "q"), json={"toEnd": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["target"] == "end" and body["leasesBroken"] == 1
    assert body["group"] == "g" and body["queue"] == "q" and body["partition"] is None
    (part,) = body["partitions"]
    assert part == {
        "partition": "Default",
        "partitionId": held["partitionId"],
        "oldCursor": 0,
        "newCursor": 5,
        "lag": 0,
        "leaseBroken": True,
    }
    row = await conn.fetchrow("SELECT * FROM queen.log_consumers WHERE consumer_group = 'g'")
    assert row["lease_id"] is None and row["lease_end"] is None and row["released_lease_id"] is None
    assert "acked" not in row.keys() and row["delivered_end"] == 5 and row["attempts"] == 0
    assert await pop(http, "q", consumerGroup="g") is None
    # the broken lease's holder can no longer ack
    m = held["messages"][0]
    ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
    res = (await http.post("/api/v1/ack", json={**ack, "consumerGroup": "g", "status": "completed"})).json()
    assert res[0]["success"] is False

    r = await http.post(seek_url("g", "q"), json={"toStart": True})
    assert r.json()["partitions"][0]["newCursor"] == 0 and r.json()["leasesBroken"] == 0
    again = await pop(http, "q", consumerGroup="g", batch=10)
    assert [x["data"] for x in again["messages"]] == [0, 1, 2, 3, 4]
    assert {x["deliveryAttempt"] for x in again["messages"]} == {1}


async def test_seek_to_timestamp_replays_exactly_the_messages_after_it(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    batches = [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1"]]
    for batch in batches:
        await push(http, "replay", [{"payload": x} for x in batch])
    assert await drain(http, "replay", "g") == [x for b in batches for x in b]
    times = [
        r["created_at"] for r in await conn.fetch("SELECT created_at FROM queen.log_segments ORDER BY base_offset")
    ]
    assert len(times) == 3 and times[0] < times[1] < times[2]

    # the second batch's time, written in another zone
    ts = times[1].astimezone(timezone(timedelta(hours=2))).isoformat()
    r = await http.post(seek_url("g", "replay"), json={"timestamp": ts})
    assert r.status_code == 200, r.text
    assert r.json()["partitions"][0]["oldCursor"] == 8 and r.json()["partitions"][0]["newCursor"] == 3
    assert await drain(http, "replay", "g") == ["b0", "b1", "b2", "c0", "c1"]

    # a time after the last write: the end; a time before everything: the first retained message
    later = (times[2] + timedelta(microseconds=1)).isoformat()
    r = await http.post(seek_url("g", "replay"), json={"timestamp": later})
    assert r.json()["partitions"][0]["newCursor"] == 8
    await conn.execute("DELETE FROM queen.log_segments WHERE base_offset = 0")  # as retention would
    r = await http.post(seek_url("g", "replay"), json={"timestamp": "2000-01-01T00:00:00Z"})
    assert r.json()["partitions"][0]["newCursor"] == 3
    r = await http.post(seek_url("g", "replay"), json={"toStart": True})
    assert r.json()["partitions"][0]["newCursor"] == 3
    assert await drain(http, "replay", "g") == ["b0", "b1", "b2", "c0", "c1"]


async def test_seek_one_partition(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": f"x{i}"} for i in range(3)], "p1")
    await push(http, "q", [{"payload": f"y{i}"} for i in range(2)], "p2")
    assert len(await drain(http, "q", "g")) == 5
    r = await http.post(seek_url("g", "q", "p1"), json={"toStart": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["partition"] == "p1" and [p["partition"] for p in body["partitions"]] == ["p1"]
    assert await cursors(conn, "g") == {"p1": 0, "p2": 2}
    assert await drain(http, "q", "g") == ["x0", "x1", "x2"]
    assert_error(await http.post(seek_url("g", "q", "nope"), json={"toEnd": True}), 404, "not_found")


BAD_SEEKS: list[tuple[dict[str, Any], str]] = [
    ({"content": b""}, "bad_request"),  # what the client sends for seek() without options
    ({"json": {}}, "bad_request"),
    ({"json": {"toEnd": False}}, "bad_request"),
    ({"json": {"toEnd": True, "timestamp": "2026-01-01T00:00:00Z"}}, "bad_request"),
    ({"json": {"toEnd": True, "toStart": True}}, "bad_request"),
    ({"json": {"toEnd": "yes"}}, "bad_request"),
    ({"json": {"timestamp": "2026-01-01T00:00:00"}}, "bad_request"),  # no zone
    ({"json": {"timestamp": "yesterday"}}, "bad_request"),
    ({"json": {"timestamp": 1700000000000}}, "bad_request"),
    ({"json": {"toEnd": True, "partition": "p1"}}, "bad_request"),  # unknown key
    ({"json": ["toEnd"]}, "bad_request"),
    ({"content": b"{nope", "headers": {"content-type": "application/json"}}, "bad_json"),
]


async def test_bad_seek_is_400_and_moves_nothing(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": i} for i in range(3)])
    await pop(http, "q", consumerGroup="g", autoAck=True)
    await pop(http, "q", consumerGroup="g")  # a live lease, which a refused seek must not break
    before = await conn.fetch("SELECT * FROM queen.log_consumers ORDER BY partition_id")
    for kwargs, code in BAD_SEEKS:
        r = await http.post(seek_url("g", "q"), **kwargs)
        assert_error(r, 400, code)
        if "content" in kwargs and not kwargs["content"]:
            assert "toEnd" in r.json()["error"]
    assert await conn.fetch("SELECT * FROM queen.log_consumers ORDER BY partition_id") == before
    assert before[0]["lease_id"] is not None


async def test_seek_unknown_queue_or_group_is_404(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": 1}])
    await pop(http, "q", consumerGroup="g", autoAck=True)
    assert_error(await http.post(seek_url("g", "nowhere"), json={"toEnd": True}), 404, "not_found")
    r = await http.post(seek_url("other", "q"), json={"toEnd": True})
    assert_error(r, 404, "not_found")
    assert "other" in r.json()["error"] and "q" in r.json()["error"]
    assert_error(await http.post(seek_url("g" * 256, "q"), json={"toEnd": True}), 413, "name_too_long")


async def test_delete_with_metadata_breaks_leases_and_the_group_starts_over(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"payload": i} for i in range(3)])
    await push(http, "keep", [{"payload": "k"}])
    assert await drain(http, "keep", "g") == ["k"]
    await pop(http, "q", consumerGroup="g", batch=3)  # a live lease
    r = await http.delete(f"{GROUPS}/g/queues/q", params={"deleteMetadata": "true"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["deleteMetadata"] is True
    assert body["cursorsDeleted"] == 1 and body["leasesBroken"] == 1
    assert body["queues"] == [
        {
            "queue": "q",
            "cursorsDeleted": 1,
            "leasesBroken": 1,
            "groupDeleted": True,
            "cursorsRecreated": 0,
            "resumeFrom": None,
        }
    ]
    groups = await conn.fetch("SELECT q.name FROM queen.log_groups g JOIN queen.queues q ON q.id = g.queue_id")
    assert [g["name"] for g in groups] == ["keep"]  # the group on the other queue is untouched
    # the next pop creates the group anew: from the first retained message
    assert await drain(http, "q", "g") == [0, 1, 2]
    assert await drain(http, "keep", "g") == []
    assert_error(await http.delete(f"{GROUPS}/nobody/queues/q"), 404, "not_found")
    assert_error(await http.delete(f"{GROUPS}/g/queues/nowhere"), 404, "not_found")
    assert_error(await http.delete(f"{GROUPS}/g/queues/q", params={"deleteMetadata": "maybe"}), 400, "bad_request")


async def test_delete_without_metadata_resumes_from_the_subscription(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"payload": "old"}])
    assert await pop(http, "q", consumerGroup="g", subscriptionMode="new") is None
    await push(http, "q", [{"payload": "new1"}, {"payload": "new2"}])
    assert await drain(http, "q", "g") == ["new1", "new2"]

    r = await http.delete(f"{GROUPS}/g", params={"deleteMetadata": "false"})
    assert r.status_code == 200, r.text
    body = r.json()
    (q,) = body["queues"]
    assert q["groupDeleted"] is False and q["cursorsDeleted"] == 1 and q["cursorsRecreated"] == 1
    assert q["resumeFrom"].endswith("Z")
    assert await conn.fetchval("SELECT subscription_mode FROM queen.log_groups WHERE name = 'g'") == "new"
    assert await drain(http, "q", "g") == ["new1", "new2"]  # not "old": written before the subscription


async def test_delete_everywhere(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    for q in ("q1", "q2"):
        await push(http, q, [{"payload": q}])
        await drain(http, q, "g")
    await drain(http, "q1", "h")
    r = await http.delete(f"{GROUPS}/g")  # deleteMetadata defaults to true, like the client
    assert r.status_code == 200, r.text
    assert [q["queue"] for q in r.json()["queues"]] == ["q1", "q2"] and r.json()["cursorsDeleted"] == 2
    assert await conn.fetchval("SELECT count(*) FROM queen.log_groups WHERE name = 'g'") == 0
    assert await cursors(conn, "h") == {"Default": 1}
    assert_error(await http.get(f"{GROUPS}/g"), 404, "not_found")
    assert_error(await http.delete(f"{GROUPS}/g"), 404, "not_found")


async def test_subscription_records_the_rule_without_moving_cursors(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"payload": "a"}])
    await push(http, "q", [{"payload": "b"}])
    assert await drain(http, "q", "g") == ["a", "b"]
    t_b = await conn.fetchval("SELECT created_at FROM queen.log_segments WHERE base_offset = 1")

    r = await http.post(f"{GROUPS}/g/subscription", json={"subscriptionTimestamp": t_b.isoformat()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["cursorsMoved"] is False and "not moved" in body["note"]
    assert body["queues"] == ["q"] and body["subscriptionFrom"].endswith("Z")
    row = await conn.fetchrow("SELECT subscription_mode, subscribed_from FROM queen.log_groups WHERE name = 'g'")
    assert row["subscription_mode"] == "from" and row["subscribed_from"] == t_b
    assert await cursors(conn, "g") == {"Default": 2}
    # the rule is what a reset without metadata deletion resumes from
    await http.delete(f"{GROUPS}/g/queues/q", params={"deleteMetadata": "false"})
    assert await drain(http, "q", "g") == ["b"]

    no_body = await http.post(f"{GROUPS}/g/subscription", content=b"")
    assert_error(no_body, 400, "bad_request")
    assert "subscriptionTimestamp" in no_body.json()["error"]
    for bad in ({"subscriptionTimestamp": "soon"}, {"subscriptionTimestamp": "2026-01-01T00:00:00"}, {"x": 1}):
        assert_error(await http.post(f"{GROUPS}/g/subscription", json=bad), 400, "bad_request")
    ok = {"subscriptionTimestamp": "2026-01-01T00:00:00Z"}
    assert_error(await http.post(f"{GROUPS}/nobody/subscription", json=ok), 404, "not_found")


async def test_official_client(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await client.queue("cq").create()
        await client.queue("cq").push([{"data": {"i": i}} for i in range(4)])
        got = await client.queue("cq").group("ops").batch(2).wait(False).pop()
        assert [m["data"]["i"] for m in got] == [0, 1]

        seek = await client.admin.seek_consumer_group("ops", "cq", {"toEnd": True})
        assert seek["success"] is True and seek["leasesBroken"] == 1
        assert seek["partitions"][0]["newCursor"] == 4
        assert await client.queue("cq").group("ops").batch(10).wait(False).pop() == []

        listed = await client.admin.list_consumer_groups()
        assert [(g["name"], g["queue"], g["totalLag"]) for g in listed["consumerGroups"]] == [("ops", "cq", 0)]
        detail = await client.admin.get_consumer_group("ops")
        assert detail["queues"][0]["partitions"][0]["cursor"] == 4

        with pytest.raises(httpx.HTTPStatusError) as err:  # no options: no body, and no target
            await client.admin.seek_consumer_group("ops", "cq")
        assert err.value.response.status_code == 400

        updated = await client.update_consumer_group_timestamp("ops", "2020-01-01T00:00:00Z")
        assert updated["cursorsMoved"] is False

        deleted = await client.delete_consumer_group("ops")
        assert deleted["success"] is True and deleted["cursorsDeleted"] == 1
        assert (await client.admin.list_consumer_groups())["consumerGroups"] == []
        # gone: the next pop starts the group over from the first message
        again = await client.queue("cq").group("ops").batch(10).wait(False).pop()
        assert [m["data"]["i"] for m in again] == [0, 1, 2, 3]
