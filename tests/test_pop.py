"""GET /api/v1/pop over real HTTP: claims, leases, groups, long-poll wake-ups, bad parameters."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.helpers import eventually, pop, push


async def test_empty_and_unknown_queue_answer_204_without_body(http: httpx.AsyncClient) -> None:
    r = await http.get("/api/v1/pop/queue/nothing-here")
    assert r.status_code == 204 and r.content == b""
    await push(http, "q", [{"payload": 1}])
    assert (await pop(http, "q", autoAck=True)) is not None
    r = await http.get("/api/v1/pop/queue/q")
    assert r.status_code == 204 and r.content == b""


async def test_pop_shape_and_lease(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    pushed = await push(http, "q", [{"payload": {"n": 1}, "transactionId": "a"}], "p1")
    ans = await pop(http, "q", batch=5, consumerGroup="g1")
    assert ans["success"] is True and ans["queue"] == "q" and ans["partition"] == "p1"
    assert ans["partitionId"] == pushed[0]["partitionId"] and ans["consumerGroup"] == "g1"
    assert ans["partitionsClaimed"] == 1 and ans["leaseId"]
    (m,) = ans["messages"]
    assert m["transactionId"] == "a" and m["data"] == {"n": 1} and m["id"] == pushed[0]["messageId"]
    assert m["partitionId"] == pushed[0]["partitionId"] and m["leaseId"] == ans["leaseId"]
    assert m["deliveryAttempt"] == 1 and m["createdAt"].endswith("Z")
    row = await conn.fetchrow("SELECT lease_id, lease_end, lease_expires_at - now() AS left FROM queen.log_consumers")
    assert str(row["lease_id"]) == ans["leaseId"] and row["lease_end"] == 1
    assert 290 < row["left"].total_seconds() <= 300  # the queue's default leaseTime
    # leased: nobody else gets it, in the same group
    assert await pop(http, "q", consumerGroup="g1") is None
    # another group reads every message with its own cursor
    other = await pop(http, "q", consumerGroup="g2")
    assert [x["transactionId"] for x in other["messages"]] == ["a"]


async def test_lease_time_comes_from_queue_config(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    r = await http.post("/api/v1/configure", json={"queue": "short", "options": {"leaseTime": 30}})
    assert r.status_code == 200
    await push(http, "short", [{"payload": 1}])
    await pop(http, "short")
    left = await conn.fetchval("SELECT extract(epoch FROM lease_expires_at - now()) FROM queen.log_consumers")
    assert 20 < left <= 30


async def test_batch_and_order_within_partition(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": i} for i in range(10)])
    first = await pop(http, "q", batch=4, autoAck=True)
    second = await pop(http, "q", batch=100, autoAck=True)
    assert [m["data"] for m in first["messages"]] == [0, 1, 2, 3]
    assert [m["data"] for m in second["messages"]] == list(range(4, 10))
    assert first["leaseId"] == "" and first["messages"][0]["leaseId"] is None


async def test_partition_route_and_lease_per_partition(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": "a"}], "pa")
    await push(http, "q", [{"payload": "b"}], "pb")
    only_b = await pop(http, "q", partition="pb", batch=10)
    assert [m["data"] for m in only_b["messages"]] == ["b"]
    # pb is leased; a queue-wide pop claims the other partition
    rest = await pop(http, "q", batch=10)
    assert [m["data"] for m in rest["messages"]] == ["a"]
    assert await pop(http, "q", batch=10) is None


async def test_oldest_partition_first(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": "old"}], "z-old")
    await push(http, "q", [{"payload": "new"}], "a-new")
    ans = await pop(http, "q", batch=10)
    assert ans["partition"] == "z-old"


async def test_multi_partition_claim_under_one_lease(http: httpx.AsyncClient) -> None:
    for p in ("p1", "p2", "p3"):
        await push(http, "q", [{"payload": p}], p)
    ans = await pop(http, "q", batch=10, partitions=3)
    assert ans["partitionsClaimed"] == 3
    assert sorted(m["data"] for m in ans["messages"]) == ["p1", "p2", "p3"]
    assert {m["leaseId"] for m in ans["messages"]} == {ans["leaseId"]}
    assert len({m["partitionId"] for m in ans["messages"]}) == 3


async def test_long_poll_wakes_when_a_push_commits(start_broker) -> None:  # type: ignore[no-untyped-def]
    # the poll interval is far beyond the test's timeout: only the push's wake-up can answer in time
    b = await start_broker(pop_poll_interval_ms=60_000)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        waiting = asyncio.create_task(
            http.get("/api/v1/pop/queue/lp", params={"wait": "true", "timeout": 50_000, "consumerGroup": "g"})
        )
        await eventually(lambda: b.app.state.queen.waiters.parked == 1, what="the pop to park")
        await push(http, "lp", [{"payload": "wake"}])
        r = await asyncio.wait_for(waiting, 20)
    assert r.status_code == 200
    assert [m["data"] for m in r.json()["messages"]] == ["wake"]


async def test_long_poll_answers_204_at_deadline(http: httpx.AsyncClient) -> None:
    r = await http.get("/api/v1/pop/queue/none", params={"wait": "true", "timeout": 200})
    assert r.status_code == 204


async def test_parked_pop_holds_no_connection(start_broker) -> None:  # type: ignore[no-untyped-def]
    b = await start_broker(db_pool_size=2)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        parked = [
            asyncio.create_task(
                http.get("/api/v1/pop/queue/idle", params={"wait": "true", "timeout": 30_000, "autoAck": "true"})
            )
            for _ in range(6)
        ]
        await eventually(lambda: b.app.state.queen.waiters.parked == 6, what="six pops to park")
        # six parked pops, a pool of two: pushes still get connections
        res = await push(http, "other", [{"payload": 1}])
        assert res[0]["status"] == "queued"
        db = b.app.state.queen.db
        assert db.pool.get_size() - db.idle_size() == 0
        await push(http, "idle", [{"payload": i} for i in range(6)])
        answers = await asyncio.gather(*parked)
    got = sorted(m["data"] for r in answers if r.status_code == 200 for m in r.json()["messages"])
    assert got == list(range(6))  # each parked pop got exactly one distinct message


@pytest.mark.parametrize(
    "params",
    [
        {"batch": 0},
        {"batch": "ten"},
        {"wait": "maybe"},
        {"timeout": -1},
        {"partitions": 0},
        {"subscriptionFrom": "yesterday"},
        {"leaseSeconds": 0},
        {"leaseSeconds": "one"},
        {"leaseSeconds": 7 * 86400 + 1},
        {"autoAck": "2"},
    ],
)
async def test_bad_pop_parameters_are_400(http: httpx.AsyncClient, params: dict[str, object]) -> None:
    r = await http.get("/api/v1/pop/queue/q", params=params)
    assert r.status_code == 400
    assert r.json()["code"] == "bad_request" and r.json()["error"]


async def test_autopilot_echo(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": i} for i in range(3)])
    ans = await pop(http, "q", autopilot=True)
    assert len(ans["messages"]) == 3
    assert set(ans["autopilot"]) == {"partitions", "batch", "waitMs"}
