"""POST /api/v1/transaction: one commit for a whole step, every rollback reason and every limit."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from queen import Queen

from queen_pg.jobs.timers import TimersJob
from tests.conftest import Broker
from tests.dashboard.seed import fulfil_order
from tests.helpers import pop, push


def ack_op(m: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "ack",
        "transactionId": m["transactionId"],
        "partitionId": m["partitionId"],
        "leaseId": m["leaseId"],
        **extra,
    }


def push_op(queue: str, txn: str, payload: Any, partition: str = "Default") -> dict[str, Any]:
    return {
        "type": "push",
        "items": [{"queue": queue, "partition": partition, "transactionId": txn, "payload": payload}],
    }


def timer_op(queue: str, key: str, payload: Any, delay_ms: int, txn: str) -> dict[str, Any]:
    return {
        "op": "schedule",
        "queue": queue,
        "timerKey": key,
        "delayMs": delay_ms,
        "txn": txn,
        "payload": base64.b64encode(orjson.dumps(payload)).decode(),
    }


async def tx(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    body.setdefault("requiredLeases", [])
    r = await http.post("/api/v1/transaction", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def state(conn: asyncpg.Connection) -> dict[str, Any]:
    return {
        "cursor": [
            tuple(r)
            for r in await conn.fetch(
                "SELECT partition_id, consumer_group, cursor_offset, lease_id FROM queen.log_consumers ORDER BY 1, 2"
            )
        ],
        "messages": await conn.fetchval("SELECT coalesce(sum(next_offset), 0) FROM queen.log_partitions"),
        "kv": [tuple(r) for r in await conn.fetch("SELECT ns, key, value::text, version FROM queen.kv ORDER BY 1, 2")],
        "timers": await conn.fetchval("SELECT count(*) FROM queen.timers"),
    }


async def test_a_whole_step_commits_together(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "orders", [{"payload": {"id": 1}, "transactionId": "o-1"}])
    (m,) = (await pop(http, "orders", consumerGroup="billing"))["messages"]
    res = await tx(
        http,
        {
            "operations": [ack_op(m, consumerGroup="billing"), push_op("invoices", "inv-1", {"order": 1})],
            "requiredLeases": [m["leaseId"]],
            "kv": [
                {"op": "put", "ns": "orders", "key": "1", "value": {"state": "invoiced"}, "ttlSeconds": 60},
                {"op": "putIfAbsent", "ns": "dedupe", "key": "o-1", "value": True, "ttlSeconds": 60, "required": True},
            ],
            "timers": [timer_op("reminders", "r-1", {"order": 1}, 86_400_000, "rem-1")],
        },
    )
    assert res["success"] is True and res["transactionId"]
    assert [r["index"] for r in res["results"]] == [0, 1, 2, 3, 4]
    assert res["results"][0]["success"] is True and res["results"][1]["status"] == "queued"
    assert res["results"][2]["applied"] is True and res["results"][4]["status"] == "scheduled"
    inv = await pop(http, "invoices")
    assert [x["data"] for x in inv["messages"]] == [{"order": 1}]
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'billing'") == 1
    assert await conn.fetchval("SELECT value::text FROM queen.kv WHERE key = '1'") == '{"state": "invoiced"}'
    assert await conn.fetchval("SELECT count(*) FROM queen.timers WHERE timer_key = 'r-1'") == 1


async def test_rejected_ack_rolls_everything_back(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "a"}])
    (m,) = (await pop(http, "q"))["messages"]
    before = await state(conn)
    bad = dict(m, leaseId="00000000-0000-4000-8000-000000000000")
    res = await tx(
        http,
        {
            "operations": [push_op("out", "o", 1), ack_op(bad)],
            "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}],
        },
    )
    assert res["success"] is False and res["reason"] == "rejected_ack" and res["failedIndex"] == 1
    assert "rolled back" in res["error"]
    assert await state(conn) == before


async def test_ack_of_an_already_acked_message_is_rejected(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "a"}])
    (m,) = (await pop(http, "q"))["messages"]
    await http.post("/api/v1/ack", json={"transactionId": "a", "partitionId": m["partitionId"]})
    res = await tx(http, {"operations": [{"type": "ack", "transactionId": "a", "partitionId": m["partitionId"]}]})
    assert res["reason"] == "rejected_ack" and "already committed" in res["error"]


async def test_retry_of_a_committed_step_is_a_duplicate_and_the_first_stands(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "a"}])
    (m,) = (await pop(http, "q"))["messages"]
    body = {
        "operations": [ack_op(m), push_op("out", "out-a", {"v": 1})],
        "requiredLeases": [m["leaseId"]],
        "kv": [{"op": "incr", "ns": "n", "key": "count", "delta": 1, "forever": True}],
    }
    first = await tx(http, dict(body))
    after_first = await state(conn)
    again = await tx(http, dict(body))
    assert first["success"] is True
    assert again["success"] is False and again["reason"] == "duplicate" and again["failedIndex"] == 1
    assert again["messageId"] == first["results"][1]["messageId"]
    assert await state(conn) == after_first  # the incr did not run twice


async def test_a_committed_step_resent_after_its_lease_ran_out_is_a_duplicate(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """The answer of a committed step is lost (the broker died after the commit) and the worker resends it
    once its lease has run out, before anyone claimed the partition again: the lease's row still names
    it, so the resend is this worker's own step and its pushes decide (duplicate: it committed), not a
    refused required lease (which told the worker to expect a redelivery that never comes)."""
    await push(http, "q", [{"payload": 1, "transactionId": "a"}, {"payload": 2, "transactionId": "b"}])
    m, _ = (await pop(http, "q", batch=2))["messages"]  # the lease stays live after `a`: `b` is in it
    body = {"operations": [ack_op(m), push_op("out", "out-a", {"v": 1})], "requiredLeases": [m["leaseId"]]}
    first = await tx(http, dict(body))
    assert first["success"] is True, first
    await conn.execute("UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second'")
    after_first = await state(conn)
    again = await tx(http, dict(body))
    assert again["success"] is False and again["reason"] == "duplicate", again
    assert await state(conn) == after_first
    # a lease that ran out with its message NOT committed is still refused
    await push(http, "q2", [{"payload": 1, "transactionId": "c"}])
    (n,) = (await pop(http, "q2"))["messages"]
    await conn.execute(
        "UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id = $1",
        __import__("uuid").UUID(n["leaseId"]),
    )
    late = await tx(http, {"operations": [ack_op(n)], "requiredLeases": [n["leaseId"]]})
    assert late["success"] is False and late["reason"] == "rejected_ack", late


async def test_kv_precondition_reports_the_flat_index(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await http.post(
        "/api/v1/kv", json={"operations": [{"op": "put", "ns": "n", "key": "k", "value": "v", "forever": True}]}
    )
    before = await state(conn)
    res = await tx(
        http,
        {
            "operations": [
                push_op("out", "x1", 1),
                {
                    "type": "push",
                    "items": [
                        {"queue": "out", "transactionId": "x2", "payload": 2},
                        {"queue": "out", "transactionId": "x3", "payload": 3},
                    ],
                },
            ],
            "kv": [
                {"op": "put", "ns": "n", "key": "other", "value": 1, "forever": True},
                {"op": "putIfAbsent", "ns": "n", "key": "k", "value": "w", "forever": True, "required": True},
            ],
        },
    )
    assert res["success"] is False and res["reason"] == "kv_precondition"
    assert res["failedIndex"] == 4  # 3 push items, then kv[0], kv[1]
    assert res["kvReason"] == "exists" and res["value"] == "v" and res["version"] > 0
    assert await state(conn) == before


async def test_reserved_when_another_write_holds_the_cursor(http: httpx.AsyncClient, db_url: str) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "a"}])
    (m,) = (await pop(http, "q"))["messages"]
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM queen.log_consumers FOR UPDATE")
            res = await tx(http, {"operations": [ack_op(m)]})
        assert res["success"] is False and res["reason"] == "reserved"
    finally:
        await holder.close()
    assert (await tx(http, {"operations": [ack_op(m)]}))["success"] is True


async def test_limits(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    many = [{"op": "put", "ns": "n", "key": f"k{i}", "value": i, "forever": True} for i in range(65)]
    res = await tx(http, {"operations": [], "kv": many})
    assert res["reason"] == "too_large"
    assert (await tx(http, {"operations": [], "kv": many[:64]}))["success"] is True
    twice = [
        {"op": "put", "ns": "n", "key": "same", "value": 1, "forever": True},
        {"op": "delete", "ns": "n", "key": "same"},
    ]
    assert (await tx(http, {"operations": [], "kv": twice}))["reason"] == "bad_request"
    timers = [timer_op("t", "k", 1, 10, "a"), timer_op("t", "k", 2, 10, "b")]
    assert (await tx(http, {"operations": [], "timers": timers}))["reason"] == "bad_request"
    keys = [
        {"op": "getMany", "ns": "n", "keys": [f"g{i}" for i in range(200)]},
        {"op": "getMany", "ns": "m", "keys": [f"g{i}" for i in range(57)]},
    ]
    assert (await tx(http, {"operations": [], "kv": keys}))["reason"] == "too_large"
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0


async def test_an_empty_transaction_is_an_empty_commit(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Valid by the documented schema, so not refused: nothing to commit, nothing written."""
    for body in ({"operations": [], "requiredLeases": []}, {}):
        r = await http.post("/api/v1/transaction", json=body)
        assert r.status_code == 200 and r.json() == {"transactionId": "", "success": True, "results": []}, r.text
    assert (await state(conn))["messages"] == 0


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"operations": "x"}',
        b'{"operations": [{"type": "kv", "op": "put"}]}',
        b'{"operations": [{"type": "timers"}]}',
        b'{"operations": [{"type": "ack"}]}',
        b'{"operations": [{"type": "push", "items": []}]}',
        b'{"operations": [], "kv": [{"op": "getPrefix", "ns": "n", "prefix": "a"}]}',
        b'{"operations": [], "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1}]}',
        b'{"operations": [], "timers": [{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "!!", '
        b'"delayMs": 1, "txn": "t"}]}',
    ],
)
async def test_bad_transactions_are_400(http: httpx.AsyncClient, conn: asyncpg.Connection, body: bytes) -> None:
    r = await http.post("/api/v1/transaction", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] and r.json()["code"] in ("bad_request", "bad_json", "kv_bad_request", "timers_bad_request")
    assert (await state(conn))["messages"] == 0


async def test_slow_worker_cannot_write_over_the_new_holder(broker: Broker, conn: asyncpg.Connection) -> None:
    """The seed's story: w1 pops and pauses past its lease; w2 gets the batch and commits; when w1
    wakes up, its whole transaction (ack, KV write, push) rolls back."""
    async with Queen(broker.url) as w1, Queen(broker.url) as w2:
        await w1.queue("jobs").create()
        await w1.queue("jobs").push([{"data": {"job": 1}, "transactionId": "job-1"}])
        (m1,) = await w1.queue("jobs").group("g").batch(1).wait(False).pop()
        # w1's long pause: its lease runs out
        await conn.execute("UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second'")
        (m2,) = await w2.queue("jobs").group("g").batch(1).wait(False).pop()
        assert m2["transactionId"] == "job-1" and m2["leaseId"] != m1["leaseId"] and m2["deliveryAttempt"] == 2

        async def finish(worker: Queen, m: dict[str, Any], by: str) -> Any:
            """The worker's one transaction: ack its message, record itself in KV, push its result."""
            return await (
                worker.transaction()
                .ack(m, "completed", {"consumer_group": "g"})
                .kv.put("jobs", "1", {"by": by}, ttl_seconds=60)
                .queue("results")
                .push([{"data": {"by": by}, "transactionId": f"res-{by}"}])
                .commit()
            )

        assert await finish(w2, m2, "w2")
        with pytest.raises(Exception, match="rolled back"):
            await finish(w1, m1, "w1")
        got = await w2.kv.get("jobs", "1")
        assert got["value"] == {"by": "w2"}
        results = await w1.queue("results").batch(10).wait(False).pop()
        assert [r["data"] for r in results] == [{"by": "w2"}]


async def test_client_seed_worker_once_guard_and_kv_get(broker: Broker, conn: asyncpg.Connection) -> None:
    """The seed's worker with the official client: ack + kv.put + push + a timer 24 h later, once(),
    guard(lock), kv.get after commit; the timer fires when time is passed to the firing job."""
    async with Queen(broker.url) as client:
        res = await fulfil_order(client)
        state_ = await client.kv.get("orders", "order-o-1")
        assert state_["found"] is True and state_["value"] == {"status": "paid"}
        (ship,) = await client.queue("shipments").batch(5).wait(False).pop()
        assert ship["transactionId"] == "ship-o-1" and ship["partition"] == "c-42"
        # once(): the second delivery of the same fact rolls back whole, returned not raised

        async def receipt_once(n: int) -> Any:
            """Payment pay-1's receipt, pushed at most once (the once() key), carrying ``n``."""
            return (
                await client.transaction()
                .once("dedupe", "pay-1", ttl_seconds=3600)
                .queue("receipts")
                .push([{"data": {"n": n}}])
                .commit()
            )

        first, second = await receipt_once(1), await receipt_once(2)
        assert bool(first) is True and bool(second) is False
        assert second["reason"] == "kv_precondition" and second["kvReason"] == "exists"
        assert [r["data"] for r in await client.queue("receipts").batch(5).wait(False).pop()] == [{"n": 1}]
        # guard(lock): commits while the lock is ours, not after it is gone
        lock = client.lock("daily-report", ttl_seconds=30)
        assert await lock.acquire()
        guarded = await client.transaction().guard(lock).queue("reports").push([{"data": {"daily": 1}}]).commit()
        assert bool(guarded) is True
        token = lock.token
        await lock.release()
        stale = (
            await client.transaction()
            .kv.check("queen-locks", "daily-report#0", expect=token, required=True)
            .queue("reports")
            .push([{"data": {"daily": 2}}])
            .commit()
        )
        assert bool(stale) is False
        assert [r["data"] for r in await client.queue("reports").batch(5).wait(False).pop()] == [{"daily": 1}]
        # the timer fires into its queue 24 h later (time passed to the firing job, not slept)
        job = TimersJob()
        db = broker.app.state.queen.db
        assert await job.run_once(db, now=datetime.now(UTC) + timedelta(hours=23)) == 0
        assert await job.run_once(db, now=datetime.now(UTC) + timedelta(hours=24, seconds=5)) == 1
        (reminder,) = await client.queue("reminders").batch(5).wait(False).pop()
        assert reminder["data"] == {"orderId": "o-1", "customer": "c-42"}
        assert reminder["transactionId"] == res["results"][3]["txn"]  # ack, push, kv.put, then the timer
