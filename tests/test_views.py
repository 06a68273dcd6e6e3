"""The psql operator views (sql/procedures/090_views.sql) after a push / pop / ack sequence."""

from __future__ import annotations

import asyncpg
import httpx

from tests.helpers import pop, push


async def test_views_after_push_pop_ack(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    r = await http.post("/api/v1/configure", json={"queue": "vq", "namespace": "ns", "options": {"leaseTime": 60}})
    assert r.status_code == 200, r.text
    await push(http, "vq", [{"payload": i, "transactionId": f"a{i}"} for i in range(3)], "p1")
    await push(http, "vq", [{"payload": i, "transactionId": f"b{i}"} for i in range(3, 5)], "p1")
    await push(http, "vq", [{"payload": {"n": i}, "transactionId": f"c{i}"} for i in range(3)], "p2")
    await push(http, "idle", [{"payload": 1}])  # a partition no group reads

    # group g: leases p1 [0, 5) and completes 0 and 1; the lease stays live
    held = await pop(http, "vq", consumerGroup="g", partition="p1", batch=5)
    acks = [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
        for m in held["messages"][:2]
    ]
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": "g"})
    assert all(x["success"] for x in r.json()), r.text
    # queue mode: p2's first message goes to the DLQ (which releases the lease)
    qm = await pop(http, "vq", partition="p2", batch=1)
    (m,) = qm["messages"]
    dead = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
    r = await http.post("/api/v1/ack", json={**dead, "status": "dlq", "error": "boom"})
    assert r.json()[0]["dlq"] is True, r.text

    (q,) = await conn.fetch("SELECT * FROM queen.v_queues WHERE queue = 'vq'")
    assert q["tenant"] == "default" and q["namespace"] == "ns" and q["task"] is None
    assert q["partitions"] == 2 and q["messages_written"] == 8 and q["retained_segments"] == 3
    # g: p1 5-2 + p2 3-0 = 6; queue mode: p1 5-0 + p2 3-1 = 7
    assert q["groups"] == 2 and q["backlog"] == 7 and q["leased_partitions"] == 1 and q["dlq_size"] == 1
    assert q["lease_time"] == 60 and q["retry_limit"] == 3 and q["dedup_window_seconds"] == 3600
    idle = await conn.fetchrow("SELECT * FROM queen.v_queues WHERE queue = 'idle'")
    assert idle["groups"] == 0 and idle["backlog"] is None and idle["messages_written"] == 1

    rows = await conn.fetch("SELECT * FROM queen.v_partitions ORDER BY queue, partition, consumer_group NULLS FIRST")
    got = [
        (
            r["queue"],
            r["partition"],
            r["consumer_group"],
            r["queue_mode"],
            r["cursor_offset"],
            r["lag"],
            r["lease_live"],
        )
        for r in rows
    ]
    assert got == [
        ("idle", "Default", None, None, None, None, False),
        ("vq", "p1", None, True, 0, 5, False),
        ("vq", "p1", "g", False, 2, 3, True),
        ("vq", "p2", None, True, 1, 2, False),
        ("vq", "p2", "g", False, 0, 3, False),
    ]
    g_p1 = rows[2]
    assert str(g_p1["lease_id"]) == held["leaseId"] and g_p1["lease_end"] == 5 and g_p1["delivery_attempts"] == 1
    assert g_p1["next_offset"] == 5 and g_p1["acked_total"] == 2 and g_p1["last_write"] is not None
    assert g_p1["partition_id"] == int(held["partitionId"]) and g_p1["acked_ahead"] == []

    seg_times = {
        (r["name"], r["base_offset"]): r["created_at"]
        for r in await conn.fetch(
            "SELECT p.name, s.base_offset, s.created_at FROM queen.log_segments s "
            "JOIN queen.log_partitions p ON p.id = s.partition_id"
        )
    }
    groups = await conn.fetch("SELECT * FROM queen.v_consumer_groups ORDER BY consumer_group NULLS FIRST")
    assert [(g["queue"], g["consumer_group"], g["queue_mode"]) for g in groups] == [
        ("vq", None, True),
        ("vq", "g", False),
    ]
    qmode, grp = groups
    assert grp["partitions"] == 2 and grp["total_lag"] == 6 and grp["leased_partitions"] == 1
    assert grp["subscription_mode"] == "all" and grp["subscribed_from"] is None
    # oldest pending: p1's first segment holds g's cursor (2); p2's holds its cursor (0)
    assert grp["oldest_pending_at"] == min(seg_times[("p1", 0)], seg_times[("p2", 0)])
    assert qmode["total_lag"] == 7 and qmode["leased_partitions"] == 0
    assert qmode["oldest_pending_at"] == seg_times[("p1", 0)]

    (d,) = await conn.fetch("SELECT * FROM queen.v_dlq")
    assert (d["queue"], d["partition"], d["consumer_group"], d["queue_mode"]) == ("vq", "p2", None, True)
    assert d["msg_offset"] == 0 and d["transaction_id"] == "c0" and str(d["message_id"]) == m["id"]
    assert d["error"] == "boom" and d["attempts"] >= 1
    assert d["created_at"] == seg_times[("p2", 0)] and d["failed_at"] >= d["created_at"]


async def test_views_when_nothing_lags(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "done", [{"payload": 1}])
    await pop(http, "done", consumerGroup="g", autoAck=True)
    (g,) = await conn.fetch("SELECT * FROM queen.v_consumer_groups")
    assert g["total_lag"] == 0 and g["oldest_pending_at"] is None and g["leased_partitions"] == 0
    (q,) = await conn.fetch("SELECT backlog, leased_partitions, dlq_size FROM queen.v_queues")
    assert tuple(q) == (0, 0, 0)
    assert await conn.fetch("SELECT * FROM queen.v_dlq") == []
