"""Resources over real HTTP: overview, queues, one queue, depth, partitions, namespaces, tasks, lagging
groups; their 404s and 400s; and the official client's admin helpers (queen-mq 2.6.0)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import assert_error, pop, push, push_at

R = "/api/v1/resources"


async def _world(http: httpx.AsyncClient) -> dict[str, Any]:
    """q1: p1 (5 messages) and p2 (3), group billing holding a lease of 2 on p1; q2 (ns/t): 4 messages in
    queue mode, 1 consumed with autoAck; q3: 2 messages, never popped (no group)."""
    r = await http.post("/api/v1/configure", json={"queue": "q2", "namespace": "ns", "task": "t", "options": {}})
    assert r.status_code == 200, r.text
    await push(http, "q1", [{"payload": i} for i in range(5)], "p1")
    await push(http, "q1", [{"payload": i} for i in range(3)], "p2")
    await push(http, "q2", [{"payload": i} for i in range(4)])
    await push(http, "q3", [{"payload": 0}, {"payload": 1}])
    leased = await pop(http, "q1", consumerGroup="billing", partition="p1", batch=2)
    assert len(leased["messages"]) == 2
    await pop(http, "q2", autoAck=True)
    return leased  # type: ignore[no-any-return]


async def test_overview_and_queue_list(http: httpx.AsyncClient) -> None:
    await _world(http)
    # the counts are the tenant's snapshot (asOf): the stats_snapshot job may have taken one midway
    # through _world; a refresh makes them current, as an operator would
    assert (await http.post("/api/v1/stats/refresh")).status_code == 200
    r = await http.get(f"{R}/overview")
    assert r.status_code == 200, r.text
    ov = r.json()
    assert ov["queues"] == 3 and ov["partitions"] == 4 and ov["messages"] == 14
    # backlog: q1 8 (billing), q2 3 (queue mode), q3 2 (retained, no group yet)
    assert ov["backlog"] == 13 and ov["inFlight"] == 2 and ov["dlq"] == 0
    assert ov["consumerGroups"] == 2 and ov["namespaces"] == 1 and ov["tasks"] == 1

    r = await http.get(f"{R}/queues")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 3 and body["limit"] == 100 and body["offset"] == 0
    assert [q["name"] for q in body["queues"]] == ["q1", "q2", "q3"]
    q1, q2, q3 = body["queues"]
    assert {k: q1[k] for k in ("partitions", "messages", "backlog", "inFlight", "dlq")} == {
        "partitions": 2,
        "messages": 8,
        "backlog": 8,
        "inFlight": 2,
        "dlq": 0,
    }
    assert q1["groups"] == [{"name": "billing", "queueMode": False, "lag": 8}]
    assert q1["namespace"] is None and q1["createdAt"].endswith("Z")
    assert q2["namespace"] == "ns" and q2["task"] == "t" and q2["backlog"] == 3
    assert q2["groups"] == [{"name": None, "queueMode": True, "lag": 3}]
    assert q3["groups"] == [] and q3["backlog"] == 2 and q3["inFlight"] == 0

    page = (await http.get(f"{R}/queues", params={"limit": 1, "offset": 1})).json()
    assert page["total"] == 3 and [q["name"] for q in page["queues"]] == ["q2"]
    assert (await http.get(f"{R}/queues", params={"offset": 10})).json()["queues"] == []
    found = (await http.get(f"{R}/queues", params={"search": "Q3"})).json()
    assert found["total"] == 1 and found["queues"][0]["name"] == "q3"
    tagged = (await http.get(f"{R}/queues", params={"namespace": "ns", "task": "t"})).json()
    assert [q["name"] for q in tagged["queues"]] == ["q2"]


async def test_queue_detail(http: httpx.AsyncClient) -> None:
    leased = await _world(http)
    r = await http.get(f"{R}/queues/q1")
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["name"] == "q1" and d["messages"] == 8 and d["backlog"] == 8 and d["inFlight"] == 2
    assert d["config"]["leaseTime"] == 300 and d["config"]["retryLimit"] == 3
    (billing,) = d["groups"]
    assert billing["name"] == "billing" and billing["lag"] == 8 and billing["leasedPartitions"] == 1
    assert billing["subscriptionMode"] == "all" and 0 <= billing["lagSeconds"] < 60
    assert d["partitionsTotal"] == 2 and [p["name"] for p in d["partitions"]] == ["p1", "p2"]
    p1 = d["partitions"][0]
    assert p1["nextOffset"] == 5 and p1["firstOffset"] == 0 and p1["retained"] == 5
    (g,) = p1["groups"]
    assert g["cursor"] == 0 and g["lag"] == 5 and g["leased"] is True and g["leaseExpiresAt"]
    assert p1["id"] == leased["partitionId"]

    paged = (await http.get(f"{R}/queues/q1", params={"limit": 1, "offset": 1})).json()
    assert [p["name"] for p in paged["partitions"]] == ["p2"] and paged["partitionsTotal"] == 2

    assert_error(await http.get(f"{R}/queues/nope"), 404, "not_found")
    assert_error(await http.get(f"{R}/queues/q1", params={"limit": 0}), 400, "bad_request")
    assert_error(await http.get(f"{R}/queues/" + "x" * 300), 413, "name_too_long")


async def test_queue_depth(http: httpx.AsyncClient) -> None:
    await _world(http)
    r = await http.get(f"{R}/queues/q1/depth")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "queue": "q1",
        "group": None,
        "pending": 8,
        "partitionsPending": 2,
        "conflation": False,
        "effectivePending": 8,
        "partitionsTotal": 2,
        "limit": 1000,
        "offset": 0,
        "partitions": [{"partition": "p1", "pending": 5}, {"partition": "p2", "pending": 3}],
    }
    await pop(http, "q1", consumerGroup="audit", partition="p2", batch=3, autoAck=True)
    audit = (await http.get(f"{R}/queues/q1/depth", params={"group": "audit"})).json()
    assert audit["pending"] == 5 and audit["partitionsPending"] == 1 and audit["group"] == "audit"
    worst = (await http.get(f"{R}/queues/q1/depth")).json()
    assert worst["pending"] == 8  # billing still owes everything
    q3 = (await http.get(f"{R}/queues/q3/depth")).json()
    assert q3["pending"] == 2  # no group yet: what a first consumer would receive

    assert_error(await http.get(f"{R}/queues/nope/depth"), 404, "not_found")
    assert_error(await http.get(f"{R}/queues/q1/depth", params={"group": "ghost"}), 404, "not_found")
    assert_error(await http.get(f"{R}/queues/q1/depth", params={"limit": "many"}), 400, "bad_request")


async def test_partitions_namespaces_tasks(http: httpx.AsyncClient) -> None:
    await _world(http)
    r = await http.get(f"{R}/partitions")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 4
    assert [(p["queue"], p["name"]) for p in body["partitions"]] == [
        ("q1", "p1"),
        ("q1", "p2"),
        ("q2", "Default"),
        ("q3", "Default"),
    ]
    p1 = body["partitions"][0]
    assert p1["messages"] == 5 and p1["backlog"] == 5 and p1["inFlight"] == 2 and p1["groups"] == 1
    one = (await http.get(f"{R}/partitions", params={"queue": "q1", "limit": 1})).json()
    assert one["total"] == 2 and len(one["partitions"]) == 1
    assert_error(await http.get(f"{R}/partitions", params={"queue": "nope"}), 404, "not_found")
    assert_error(await http.get(f"{R}/partitions", params={"offset": -1}), 400, "bad_request")

    ns = (await http.get(f"{R}/namespaces")).json()
    assert ns["total"] == 1
    assert ns["namespaces"] == [
        {"namespace": "ns", "queues": 1, "partitions": 1, "messages": 4, "backlog": 3, "dlq": 0}
    ]
    tasks = (await http.get(f"{R}/tasks")).json()
    assert tasks["total"] == 1 and tasks["tasks"][0]["task"] == "t"
    assert_error(await http.get(f"{R}/tasks", params={"limit": 5000}), 400, "bad_request")


async def test_lagging_groups(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    old = datetime.now(UTC) - timedelta(minutes=5)
    await push_at(conn, "old", ["a", "b", "c"], old)
    await pop(http, "old", consumerGroup="slow", batch=1, autoAck=True)  # "a" done, "b" waits since 5 min
    await push(http, "fresh", [{"payload": 1}])
    await pop(http, "fresh", consumerGroup="slow", batch=1)  # leased, fresh: not lagging
    # lagging reads the tenant's snapshot: recompute it now, so a job tick taken before the pushes
    # above cannot answer for them
    assert (await http.post("/api/v1/stats/refresh")).status_code == 200

    r = await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 60})
    assert r.status_code == 200, r.text  # not taken for a group named "lagging"
    body = r.json()
    assert body["total"] == 1 and body["minLagSeconds"] == 60
    (g,) = body["groups"]
    assert g["name"] == "slow" and g["queue"] == "old" and g["lag"] == 2 and g["partitionsBehind"] == 1
    assert 290 < g["lagSeconds"] < 400 and g["oldestPendingAt"].endswith("Z")

    assert (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 600})).json()["total"] == 0
    everyone = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 0})).json()
    assert everyone["total"] == 2 and everyone["groups"][0]["queue"] == "old"  # oldest first
    assert_error(await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": -1}), 400, "bad_request")
    # the group routes beside it still work
    assert (await http.get("/api/v1/consumer-groups/slow")).status_code == 200


@pytest.mark.parametrize("path", ["/queues", "/partitions", "/namespaces", "/tasks"])
async def test_paging_parameters_are_checked(http: httpx.AsyncClient, path: str) -> None:
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"offset": -5}):
        assert_error(await http.get(R + path, params=params), 400, "bad_request")


async def test_official_client_admin_helpers(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("orders").create()
        await client.queue("orders").partition("eu").push([{"data": {"i": i}} for i in range(3)])
        ov = await client.admin.get_overview()
        assert ov["queues"] == 1 and ov["messages"] == 3 and ov["backlog"] == 3
        listed = await client.admin.list_queues(limit=10)
        assert listed["total"] == 1 and listed["queues"][0]["name"] == "orders"
        detail = await client.admin.get_queue("orders")
        assert detail["partitions"][0]["name"] == "eu" and detail["config"]["leaseTime"] == 300
        depth = await client.admin.get_queue_depth("orders")
        assert depth["pending"] == 3 and depth["partitions"] == [{"partition": "eu", "pending": 3}]
        parts = await client.admin.get_partitions(queue="orders")
        assert parts["total"] == 1
        assert (await client.admin.get_namespaces())["namespaces"] == []
        assert (await client.admin.get_tasks())["total"] == 0
        lagging = await client.admin.get_lagging_consumers(60)
        assert lagging["groups"] == []
        refreshed = await client.admin.refresh_consumer_stats()
        assert refreshed["success"] is True
