"""Lock order and time (docs/architecture.md#lock-order): lease renew takes cursor rows in the order the
ack takes them; the ack's dead letters take no lock on a partition; the clock is read after the last
lock wait (transaction, pop). Deterministic checks with a second connection holding a lock, plus
concurrent callers in a loop over HTTP (zero deadlocks, zero 503s)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx

from queen_pg.engine.codec import txn_hash
from tests.conftest import Broker
from tests.helpers import pop, push, until


async def blocked_on_a_lock(conn: asyncpg.Connection, query_part: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
            f"%{query_part}%",
        )
    )


async def ack_items(http: httpx.AsyncClient, msgs: list[dict[str, Any]], status: str = "completed") -> Any:
    body = {
        "acknowledgments": [
            {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": status,
                "error": "x",
            }
            for m in msgs
        ],
        "consumerGroup": "g",
    }
    return await http.post("/api/v1/ack/batch", json=body)


# --- lease renew vs ack ---------------------------------------------------------------------------


async def test_lease_extend_locks_cursor_rows_in_ascending_order(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db_url: str
) -> None:
    """The lease's rows are claimed higher partition first (so placed in that order in the lease_id
    index, queen.log_leases since revision 0010); renewing used to lock them in that order while ack_v1
    locks them ascending."""
    await push(http, "lo", [{"payload": 0}], partition="A")  # A gets the lower partition id
    await push(http, "lo", [{"payload": 0}], partition="B")
    first = await pop(http, "lo", consumerGroup="g", batch=2, partitions=2)
    assert (await ack_items(http, first["messages"])).status_code == 200
    await push(http, "lo", [{"payload": 1}], partition="B")  # B's head is now the older one
    await push(http, "lo", [{"payload": 1}], partition="A")
    held = await pop(http, "lo", consumerGroup="g", batch=2, partitions=2)
    assert held["partitionsClaimed"] == 2
    a, b = sorted(int(m["partitionId"]) for m in held["messages"])
    lease = uuid.UUID(held["leaseId"])

    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        # what ack_v1 does: the lower row first ...
        await other.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = $1 FOR UPDATE", a)
        renew = asyncio.create_task(conn.fetch("SELECT * FROM queen.lease_extend_v1('default', $1)", lease))
        probe = await asyncpg.connect(db_url)
        try:
            await until(lambda: blocked_on_a_lock(probe, "lease_extend_v1"), "the renew waiting for row A")
        finally:
            await probe.close()
        # ... then the higher one: free, because the renew waits for A before it takes B
        await other.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = $1 FOR UPDATE NOWAIT", b)
        await tx.commit()
        (row,) = await asyncio.wait_for(renew, 10)
        assert row["renewed"] == 2
    finally:
        await other.close()


async def test_renewing_a_multi_partition_lease_while_acking_it(broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        statuses: list[int] = []
        for round_ in range(25):
            for p in range(8):
                await push(http, "rn", [{"payload": p, "transactionId": f"r{round_}-{p}"}], partition=f"p{p}")
            held = await pop(http, "rn", consumerGroup="g", batch=8, partitions=8)
            assert held["partitionsClaimed"] == 8
            msgs = list(reversed(held["messages"]))

            async def renew(lease: str = held["leaseId"]) -> None:
                for _ in range(4):
                    r = await http.post(f"/api/v1/lease/{lease}/extend")
                    statuses.append(r.status_code)

            async def ack(msgs: list[dict[str, Any]] = msgs) -> None:
                for half in (msgs[:4], msgs[4:]):
                    r = await ack_items(http, half)
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        assert all(i["success"] for i in r.json()), r.text

            await asyncio.gather(renew(), ack(), renew())
        assert set(statuses) == {200}, statuses


# --- dead letters vs queue delete -----------------------------------------------------------------


async def test_ack_to_dlq_takes_no_lock_on_the_partition(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db_url: str
) -> None:
    """A queue delete locks the partition rows, then (cascade) the cursor rows; the ack holds a cursor
    row and used to need KEY SHARE on the partition for log_dlq's foreign key: a deadlock."""
    res = await push(http, "dq", [{"payload": 1, "transactionId": "x"}])
    pid = int(res[0]["partitionId"])
    (m,) = (await pop(http, "dq", consumerGroup="g"))["messages"]
    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR UPDATE", pid)  # as the delete
        rows = await asyncio.wait_for(
            conn.fetch(
                "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7)",
                [pid],
                [txn_hash("x")],
                ["x"],
                [uuid.UUID(m["leaseId"])],
                ["g"],
                ["dlq"],
                ["boom"],
            ),
            10,
        )
        assert rows[0]["success"] is True and rows[0]["dlq"] is True
        await tx.rollback()
    finally:
        await other.close()


async def test_ack_to_dlq_racing_queue_delete(broker: Broker, conn: asyncpg.Connection) -> None:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        statuses: list[int] = []
        for round_ in range(25):
            q = f"qd{round_}"
            for p in range(4):
                await push(http, q, [{"payload": p, "transactionId": f"t{p}"}], partition=f"p{p}")
            held = await pop(http, q, consumerGroup="g", batch=4, partitions=4)

            async def dead(msgs: list[dict[str, Any]] = held["messages"]) -> None:
                r = await ack_items(http, msgs, status="dlq")
                statuses.append(r.status_code)

            async def delete(q: str = q) -> None:
                r = await http.delete(f"/api/v1/resources/queues/{q}")
                statuses.append(r.status_code)

            await asyncio.gather(dead(), delete())
        assert set(statuses) == {200}, statuses
        # every queue is gone, and none of their dead letters stayed behind
        assert await conn.fetchval("SELECT count(*) FROM queen.queues") == 0
        assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0


# --- the clock after the last lock wait -----------------------------------------------------------


async def test_transaction_judges_the_lease_after_waiting_for_the_push_partition(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db_url: str
) -> None:
    """Regression: transaction_v1 read the clock before push_v1 waited for the partition lock and
    judged the ack's lease at that stale time: a lease that expired during the wait was accepted."""
    assert (await http.post("/api/v1/configure", json={"queue": "tl", "options": {"leaseTime": 1}})).status_code == 200
    await push(http, "tl", [{"payload": 1, "transactionId": "in"}])
    out = await push(http, "tl-out", [{"payload": 0}])
    (m,) = (await pop(http, "tl"))["messages"]
    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(
            "SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR NO KEY UPDATE", int(out[0]["partitionId"])
        )
        body = {
            "operations": [
                {"type": "ack", "transactionId": "in", "partitionId": m["partitionId"], "leaseId": m["leaseId"]},
                {"type": "push", "items": [{"queue": "tl-out", "transactionId": "o1", "payload": 1}]},
            ],
            "requiredLeases": [m["leaseId"]],
        }
        sent = asyncio.create_task(http.post("/api/v1/transaction", json=body))
        await until(lambda: blocked_on_a_lock(conn, "transaction_v1"), "the transaction waiting in push_v1")
        await until(
            lambda: conn.fetchval("SELECT clock_timestamp() > lease_expires_at FROM queen.log_consumers"),
            "the lease to run out while the transaction waits",
        )
        await tx.commit()
        r = await asyncio.wait_for(sent, 10)
    finally:
        await other.close()
    assert r.status_code == 200
    assert r.json()["success"] is False and "lease expired" in r.json()["error"]
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 0
    assert await conn.fetchval("SELECT sum(next_offset) FROM queen.log_partitions WHERE name = 'Default'") == 2


async def test_pop_reads_the_clock_after_creating_its_group(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db_url: str
) -> None:
    """Regression: pop_v1 read the clock before _create_group waited for the queue row, so a group
    subscribed to `new` messages started at a time before it existed and received a message pushed
    while it waited."""
    await push(http, "pc", [{"payload": "old"}])
    qid = await conn.fetchval("SELECT id FROM queen.queues WHERE name = 'pc'")
    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM queen.queues WHERE id = $1 FOR UPDATE", qid)
        popped = asyncio.create_task(
            http.get("/api/v1/pop/queue/pc", params={"consumerGroup": "fresh", "subscriptionMode": "new"})
        )
        await until(lambda: blocked_on_a_lock(conn, "pop_v1"), "the pop waiting to create its group")
        await push(http, "pc", [{"payload": "during the wait"}])
        await tx.commit()
        r = await asyncio.wait_for(popped, 10)
    finally:
        await other.close()
    assert r.status_code == 204, r.text
    created = await conn.fetchval("SELECT created_at FROM queen.log_groups WHERE name = 'fresh'")
    pushed = await conn.fetchval("SELECT max(created_at) FROM queen.log_segments")
    assert created > pushed
