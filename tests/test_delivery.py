"""Delivery rules at their edges: retries and dead letters, dedup window, delay and window buffer,
subscription modes, namespace/task pops. Time is passed into the procedures, never slept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from queen_pg.engine.codec import txn_hash
from tests.helpers import ack_one, configure, pop, pop_at, push, push_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# --- retries and dead letters ------------------------------------------------------------------


async def test_retry_limit_not_yet_then_reached(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await configure(http, "r", retryLimit=2)
    await push(http, "r", [{"payload": {"n": 1}, "transactionId": "m1"}, {"payload": {"n": 2}, "transactionId": "m2"}])
    for attempt in (1, 2, 3):
        ans = await pop(http, "r", batch=10)
        assert [m["deliveryAttempt"] for m in ans["messages"]] == [attempt, attempt]
        item = await ack_one(http, ans["messages"][0], status="failed")
        assert item["success"] is True and item["leaseReleased"] is True
        assert item["dlq"] is (attempt == 3), attempt  # retryLimit 2: the third failure dead-letters
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 1
    # m1 is done (dead), m2 comes next, as a first delivery of its own
    ans = await pop(http, "r", batch=10)
    assert [m["transactionId"] for m in ans["messages"]] == ["m2"]
    dead = (await http.get("/api/v1/dlq", params={"queue": "r"})).json()
    assert dead["total"] == 1
    (d,) = dead["messages"]
    assert d["transactionId"] == "m1" and d["data"] == {"n": 1} and d["errorMessage"] == "boom"
    assert d["retryCount"] == 3 and d["queue"] == "r" and d["consumerGroup"] is None


async def test_whole_batch_failing_dead_letters_head_first(http: httpx.AsyncClient) -> None:
    await configure(http, "b", retryLimit=0)
    await push(http, "b", [{"payload": i, "transactionId": f"b{i}"} for i in range(3)])
    ans = await pop(http, "b", batch=10)
    acks = [
        {
            "transactionId": m["transactionId"],
            "partitionId": m["partitionId"],
            "leaseId": m["leaseId"],
            "status": "failed",
            "error": "x",
        }
        for m in ans["messages"]
    ]
    items = (await http.post("/api/v1/ack/batch", json={"acknowledgments": acks})).json()
    assert [i["dlq"] for i in items] == [True, False, False]  # charged once, against the lowest
    ans = await pop(http, "b", batch=10)
    assert [m["data"] for m in ans["messages"]] == [1, 2]


async def test_retry_status_redelivers_without_charging(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await configure(http, "rt", retryLimit=0)
    await push(http, "rt", [{"payload": 1, "transactionId": "x"}])
    for _ in range(3):
        (m,) = (await pop(http, "rt"))["messages"]
        assert (await ack_one(http, m, status="retry"))["dlq"] is False
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0


async def test_dlq_status_dead_letters_at_once_per_group(http: httpx.AsyncClient) -> None:
    await push(http, "d", [{"payload": "p", "transactionId": "x"}])
    (m,) = (await pop(http, "d", consumerGroup="g1"))["messages"]
    assert (await ack_one(http, m, group="g1", status="dlq"))["dlq"] is True
    (m2,) = (await pop(http, "d", consumerGroup="g2"))["messages"]  # other groups are untouched
    assert m2["transactionId"] == "x"
    g1 = (await http.get("/api/v1/dlq", params={"queue": "d", "consumerGroup": "g1"})).json()
    g2 = (await http.get("/api/v1/dlq", params={"queue": "d", "consumerGroup": "g2"})).json()
    assert g1["total"] == 1 and g2["total"] == 0


async def test_dlq_paging_and_bad_params(http: httpx.AsyncClient) -> None:
    await configure(http, "pg", retryLimit=0)
    await push(http, "pg", [{"payload": i, "transactionId": f"t{i}"} for i in range(5)])
    for _ in range(5):
        (m,) = (await pop(http, "pg"))["messages"]
        await ack_one(http, m, status="failed")
    page1 = (await http.get("/api/v1/dlq", params={"queue": "pg", "limit": 2})).json()
    page3 = (await http.get("/api/v1/dlq", params={"queue": "pg", "limit": 2, "offset": 4})).json()
    beyond = (await http.get("/api/v1/dlq", params={"queue": "pg", "limit": 2, "offset": 10})).json()
    assert page1["total"] == page3["total"] == beyond["total"] == 5
    assert [m["data"] for m in page1["messages"]] == [4, 3]  # newest first
    assert [m["data"] for m in page3["messages"]] == [0] and beyond["messages"] == []
    for params in ({"limit": 0}, {"offset": -1}, {"from": "yesterday"}):
        r = await http.get("/api/v1/dlq", params=params)
        assert r.status_code == 400 and r.json()["code"] == "bad_request"


async def test_requeue_unknown_and_bad(http: httpx.AsyncClient) -> None:
    r = await http.post("/api/v1/messages/1/none/retry")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = await http.post("/api/v1/messages/abc/none/retry")
    assert r.status_code == 400
    await push(http, "nr", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "nr"))["messages"]
    await ack_one(http, m, status="dlq")
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/x/retry")  # payload not copied out yet: fine
    assert r.status_code == 200 and r.json()["status"] == "requeued"
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/x/retry")  # once only
    assert r.status_code == 404 and r.json()["code"] == "not_found"


async def test_requeue_puts_the_dead_letter_back(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "rq", [{"payload": {"k": [1, 2]}, "transactionId": "x/y"}])
    (m,) = (await pop(http, "rq"))["messages"]
    await ack_one(http, m, status="dlq")
    await conn.execute("UPDATE queen.log_dlq SET payload = '{\"k\": [1, 2]}'")  # what the dlq_fill job does
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/x/y/retry")
    assert r.status_code == 200 and r.json()["status"] == "requeued" and r.json()["offset"] == 1
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0
    (again,) = (await pop(http, "rq"))["messages"]
    assert again["transactionId"] == "x/y" and again["data"] == {"k": [1, 2]} and again["offset"] == 1
    ack = (
        await http.post(
            "/api/v1/ack",
            json={"transactionId": "x/y", "partitionId": again["partitionId"], "leaseId": again["leaseId"]},
        )
    ).json()[0]
    assert ack["success"] is True


# --- dedup window ------------------------------------------------------------------------------


async def test_dedup_window_edge(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await configure(http, "w", dedupWindowSeconds=60)
    first = await push_at(conn, "w", ["same"], T0)
    inside = await push_at(conn, "w", ["same"], T0 + timedelta(seconds=59.999))
    assert inside[0]["status"] == "duplicate" and inside[0]["message_id"] == first[0]["message_id"]
    after = await push_at(conn, "w", ["same"], T0 + timedelta(seconds=60))
    assert after[0]["status"] == "queued" and after[0]["msg_offset"] == 1
    # the window restarts from the new message
    again = await push_at(conn, "w", ["same"], T0 + timedelta(seconds=61))
    assert again[0]["status"] == "duplicate" and again[0]["message_id"] == after[0]["message_id"]


# --- delayed processing and window buffer ------------------------------------------------------


async def test_delayed_processing_edge(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await configure(http, "dl", delayedProcessing=10)
    await push_at(conn, "dl", ["a"], T0)
    await push_at(conn, "dl", ["b"], T0 + timedelta(seconds=5))
    assert await pop_at(conn, "dl", T0 + timedelta(seconds=9.9)) == []
    assert await pop_at(conn, "dl", T0 + timedelta(seconds=10)) == [0]  # b is still too young
    assert await pop_at(conn, "dl", T0 + timedelta(seconds=14.9)) == []
    assert await pop_at(conn, "dl", T0 + timedelta(seconds=15)) == [1]


async def test_window_buffer_waits_for_a_quiet_partition(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await configure(http, "wb", windowBuffer=5)
    await push_at(conn, "wb", ["a"], T0)
    await push_at(conn, "wb", ["b"], T0 + timedelta(seconds=3))
    assert await pop_at(conn, "wb", T0 + timedelta(seconds=7.9)) == []
    assert await pop_at(conn, "wb", T0 + timedelta(seconds=8)) == [0, 1]


# --- subscription modes ------------------------------------------------------------------------


async def test_subscription_modes(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push_at(conn, "s", ["old1", "old2"], T0)
    await push_at(conn, "s", ["mid"], T0 + timedelta(seconds=10))
    t_now = T0 + timedelta(seconds=20)
    assert await pop_at(conn, "s", t_now, group="all") == [0, 1, 2]
    rows = await conn.fetch(
        "SELECT * FROM queen.pop_v1('default', 's', NULL, NULL, NULL, 'new', 10, 1, gen_random_uuid(), true, "
        "'new', NULL, $1)",
        t_now,
    )
    assert rows == []
    rows = await conn.fetch(
        "SELECT * FROM queen.pop_v1('default', 's', NULL, NULL, NULL, 'from', 10, 1, gen_random_uuid(), true, "
        "NULL, $1, $2)",
        T0 + timedelta(seconds=5),
        t_now,
    )
    assert [r["lease_start"] for r in rows] == [2]
    await push_at(conn, "s", ["late"], T0 + timedelta(seconds=30))
    assert await pop_at(conn, "s", T0 + timedelta(seconds=31), group="new") == [3]
    # a partition created after the group appeared is read from its start
    await push_at(conn, "s", ["p2"], T0 + timedelta(seconds=32), partition="p2")
    assert await pop_at(conn, "s", T0 + timedelta(seconds=33), group="new") == [0]


async def test_subscription_mode_new_over_http(http: httpx.AsyncClient) -> None:
    await push(http, "sn", [{"payload": "before"}])
    assert await pop(http, "sn", consumerGroup="fresh", subscriptionMode="new") is None
    await push(http, "sn", [{"payload": "after"}])
    ans = await pop(http, "sn", consumerGroup="fresh", batch=10)
    assert [m["data"] for m in ans["messages"]] == ["after"]


# --- pop variants ------------------------------------------------------------------------------


async def test_namespace_task_pop(http: httpx.AsyncClient) -> None:
    for q, ns, task in (("n1", "billing", "invoice"), ("n2", "billing", "refund"), ("n3", "other", "invoice")):
        r = await http.post("/api/v1/configure", json={"queue": q, "namespace": ns, "task": task})
        assert r.status_code == 200
        await push(http, q, [{"payload": q}])
    r = await http.get("/api/v1/pop", params={"namespace": "billing", "batch": 10, "partitions": 10})
    assert sorted(m["queue"] for m in r.json()["messages"]) == ["n1", "n2"]
    r = await http.get("/api/v1/pop", params={"task": "invoice", "batch": 10, "partitions": 10, "consumerGroup": "g"})
    assert sorted(m["data"] for m in r.json()["messages"]) == ["n1", "n3"]
    r = await http.get("/api/v1/pop")
    assert r.status_code == 400


@pytest.mark.parametrize("partitions", [1, 3])
async def test_autopilot_chooses_batch_and_partitions(http: httpx.AsyncClient, partitions: int) -> None:
    for p in range(5):
        await push(http, "ap", [{"payload": i} for i in range(7)], f"p{p}")
    params: dict[str, object] = {"autopilot": True}
    if partitions > 1:
        params["partitions"] = partitions
    ans = await pop(http, "ap", **params)
    expect_parts = partitions if partitions > 1 else 4
    assert ans["autopilot"]["partitions"] == ans["partitionsClaimed"] == expect_parts
    assert ans["autopilot"]["batch"] == len(ans["messages"]) == 7 * expect_parts


async def test_requeue_does_not_strand_another_group(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Regression: a requeued dead letter shares its transactionId with the original; a group that has
    not consumed the original yet must still be able to ack it (and later the copy)."""
    await push(http, "two", [{"payload": "d0", "transactionId": "d0"}, {"payload": "d1", "transactionId": "d1"}])
    (m,) = (await pop(http, "two", consumerGroup="g1"))["messages"]
    await ack_one(http, m, group="g1", status="dlq")
    await conn.execute("UPDATE queen.log_dlq SET payload = '\"d0\"'")  # what the dlq_fill job does
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/d0/retry")
    assert r.status_code == 200 and r.json()["offset"] == 2
    # g2 reads the original d0 (offset 0), d1, then the copy (offset 2): every ack is accepted
    seen = []
    for _ in range(3):
        (x,) = (await pop(http, "two", consumerGroup="g2"))["messages"]
        ack = await http.post(
            "/api/v1/ack",
            json={
                "transactionId": x["transactionId"],
                "partitionId": x["partitionId"],
                "leaseId": x["leaseId"],
                "consumerGroup": "g2",
            },
        )
        assert ack.json()[0]["success"] is True, ack.text
        seen.append((x["offset"], x["transactionId"]))
    assert seen == [(0, "d0"), (1, "d1"), (2, "d0")]


async def test_pending_message_stays_ackable_after_its_id_is_reused(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await configure(http, "ru", dedupWindowSeconds=60)
    await push_at(conn, "ru", ["same"], T0)
    await push_at(conn, "ru", ["same"], T0 + timedelta(seconds=61))  # after the window: a new message
    rows = await conn.fetch(
        "SELECT * FROM queen.pop_v1('default', 'ru', NULL, NULL, NULL, 'g', 1, 1, gen_random_uuid(), false, "
        "NULL, NULL, $1)",
        T0 + timedelta(seconds=62),
    )
    lease, pid = rows[0]["lease_start"], rows[0]["partition_id"]
    assert lease == 0
    lease_id = await conn.fetchval("SELECT lease_id FROM queen.log_consumers")
    (ok,) = await conn.fetch(
        "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7, $8)",
        [pid],
        [txn_hash("same")],
        ["same"],
        [lease_id],
        ["g"],
        ["completed"],
        [None],
        T0 + timedelta(seconds=63),
    )
    assert ok["success"] is True and not ok["noop"], ok["error"]
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 1
