"""Review of log_consumers.head_at (pop discovery): every path that moves a cursor, makes a
group's cursors or appends to a partition leaves a cursor with a message to deliver pending (head_at
set), so a pop that names no partition finds it. Real broker, real HTTP, real PostgreSQL; after each
step the invariant is checked on every cursor row, and the message is popped without naming its
partition."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx

from tests.helpers import pop, push

# a cursor with a message at or above it that its group does not pass over, and head_at NULL
HIDDEN = """
SELECT q.name AS queue, p.name AS partition, lc.consumer_group, lc.cursor_offset, p.next_offset
  FROM queen.log_consumers lc
  JOIN queen.log_partitions p ON p.id = lc.partition_id
  JOIN queen.queues q ON q.id = lc.queue_id
 WHERE lc.head_at IS NULL
   AND EXISTS (SELECT 1 FROM generate_series(lc.cursor_offset, p.next_offset - 1) o
                WHERE NOT EXISTS (SELECT 1 FROM queen.log_passes ps
                                   WHERE ps.partition_id = lc.partition_id
                                     AND ps.consumer_group = lc.consumer_group AND ps.msg_offset = o))
"""


async def no_hidden(conn: asyncpg.Connection) -> None:
    rows = [dict(r) for r in await conn.fetch(HIDDEN)]
    assert rows == [], f"cursors with pending messages but head_at NULL: {rows}"


async def drain(http: httpx.AsyncClient, queue: str, group: str | None = None) -> list[Any]:
    """Pop (no partition named) and ack until nothing comes; the payloads in order."""
    got: list[Any] = []
    params: dict[str, Any] = {"batch": 10}
    if group is not None:
        params["consumerGroup"] = group
    while (ans := await pop(http, queue, **params)) is not None:
        acks = [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
            for m in ans["messages"]
        ]
        r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": group})
        assert r.status_code == 200 and all(x["success"] for x in r.json()), r.text
        got += [m["data"] for m in ans["messages"]]
    return got


async def test_seek_to_start_and_timestamp_after_catching_up(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "s", [{"payload": i} for i in range(3)], partition="a")
    assert await drain(http, "s", "g") == [0, 1, 2]
    await no_hidden(conn)
    r = await http.post("/api/v1/consumer-groups/g/queues/s/seek", json={"toStart": True})
    assert r.status_code == 200, r.text
    await no_hidden(conn)
    assert await drain(http, "s", "g") == [0, 1, 2]
    r = await http.post("/api/v1/consumer-groups/g/queues/s/seek", json={"timestamp": "2000-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    await no_hidden(conn)
    assert await drain(http, "s", "g") == [0, 1, 2]
    r = await http.post("/api/v1/consumer-groups/g/queues/s/partitions/a/seek", json={"toEnd": True})
    assert r.status_code == 200, r.text
    await push(http, "s", [{"payload": 3}], partition="a")
    await no_hidden(conn)
    assert await drain(http, "s", "g") == [3]


async def test_group_deleted_and_recreated(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "d", [{"payload": i} for i in range(2)], partition="a")
    assert await drain(http, "d", "g") == [0, 1]
    r = await http.delete("/api/v1/consumer-groups/g", params={"deleteMetadata": "false"})
    assert r.status_code == 200, r.text
    await no_hidden(conn)
    assert await drain(http, "d", "g") == [0, 1]  # recreated from the kept rule: from the beginning
    r = await http.delete("/api/v1/consumer-groups/g", params={"deleteMetadata": "true"})
    assert r.status_code == 200, r.text
    assert await drain(http, "d", "g") == [0, 1]  # a new group, from the beginning
    await no_hidden(conn)


async def test_nack_and_lease_release_keep_the_cursor_pending(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "n", [{"payload": i} for i in range(3)], partition="a")
    ans = await pop(http, "n", batch=3)
    m = ans["messages"]
    # commit the first, nack the second: the cursor clamps at the nack
    r = await http.post(
        "/api/v1/ack/batch",
        json={"acknowledgments": [
            {"transactionId": m[0]["transactionId"], "partitionId": m[0]["partitionId"], "leaseId": m[0]["leaseId"]},
            {"transactionId": m[1]["transactionId"], "partitionId": m[1]["partitionId"], "leaseId": m[1]["leaseId"],
             "status": "failed"},
        ]},
    )  # fmt: skip
    assert r.status_code == 200 and all(x["success"] for x in r.json()), r.text
    await no_hidden(conn)
    assert await drain(http, "n") == [1, 2]


async def test_dead_letter_requeued_to_a_caught_up_group(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "r", [{"payload": "x"}], partition="a")
    ans = await pop(http, "r", consumerGroup="g")
    m = ans["messages"][0]
    r = await http.post(
        "/api/v1/ack",
        json={"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
              "status": "dlq", "consumerGroup": "g"},
    )  # fmt: skip
    assert r.status_code == 200 and r.json()[0]["success"], r.text
    assert await drain(http, "r", "g") == []
    await no_hidden(conn)
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}/retry")
    assert r.status_code == 200, r.text
    await no_hidden(conn)
    assert await drain(http, "r", "g") == ["x"]


async def test_transaction_ack_and_push_into_the_same_partition(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "t", [{"payload": 0}], partition="a")
    m = (await pop(http, "t"))["messages"][0]
    r = await http.post(
        "/api/v1/transaction",
        json={"operations": [
            {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"]},
            {"type": "push", "items": [{"queue": "t", "partition": "a", "payload": 1}]},
        ], "requiredLeases": [m["leaseId"]]},
    )  # fmt: skip
    assert r.status_code == 200 and r.json()["success"], r.text
    await no_hidden(conn)
    assert await drain(http, "t") == [1]


async def test_new_partition_for_an_existing_group_and_new_only_group(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "p", [{"payload": 0}], partition="a")
    assert await drain(http, "p", "g") == [0]
    assert await pop(http, "p", consumerGroup="late", subscriptionMode="new") is None
    await push(http, "p", [{"payload": 1}], partition="b")  # a partition the groups have not seen
    await push(http, "p", [{"payload": 2}], partition="a")
    await no_hidden(conn)
    assert sorted(await drain(http, "p", "g")) == [1, 2]
    assert sorted(await drain(http, "p", "late")) == [1, 2]


async def test_an_append_that_woke_no_cursor_is_repaired_at_boot(conn: asyncpg.Connection) -> None:
    """A broker of the previous release re-applies its own sql/ when it boots (an old replica restarting
    during a rolling deploy, or a rollback): its push_v1 does not wake caught-up cursors, while the
    triggers, created once, stay and keep marking cursors caught up. Its appends leave cursors with a
    message and no head; when this release boots again its pops never see them. Boot must make every
    cursor with something to read pending."""
    from queen_pg.db.apply import apply_sql
    from tests.test_pop_discovery import P, fill
    from tests.test_pop_discovery import ack as sql_ack
    from tests.test_pop_discovery import pop as sql_pop

    await fill(conn, "q", 1)
    assert len(await sql_pop(conn, "q")) == 1
    await sql_ack(conn, "q", P(0))  # caught up: head_at NULL
    # the previous release's push: the same append, no wake
    await conn.execute(
        "CREATE OR REPLACE FUNCTION queen._wake_cursors(p_pids bigint[], p_times timestamptz[]) "
        "RETURNS void LANGUAGE sql AS $$ SELECT $$"
    )
    await fill(conn, "q", 1)  # p0 offset 1
    assert [dict(r) for r in await conn.fetch(HIDDEN)] != []  # stranded: a pop of this release misses it
    assert await sql_pop(conn, "q") == []
    await apply_sql(conn)  # this release boots again
    await no_hidden(conn)
    got = await sql_pop(conn, "q")
    assert [(r["partition_name"], r["lease_start"]) for r in got] == [(P(0), 1)]


async def test_namespace_pop_looks_past_unclaimable_oldest_partitions(conn: asyncpg.Connection) -> None:
    """A pop across queues (namespace/task) takes its candidates from each queue's oldest heads, a
    fixed number of them, before it filters out partitions waiting out a windowBuffer or held by other
    pops. When every candidate is such a partition, an older-headed queue hides the others: a claimable
    partition of another queue must still be found (the previous release's pop found it)."""
    from tests.test_pop_discovery import fill
    from tests.test_pop_discovery import pop as sql_pop

    await fill(conn, "busy", 40)  # older heads, then a windowBuffer they are all inside of
    await fill(conn, "calm", 1, prefix="c")
    await conn.execute("UPDATE queen.queues SET namespace = 'ns' WHERE name IN ('busy', 'calm')")
    await conn.execute("UPDATE queen.queues SET window_buffer = 3600 WHERE name = 'busy'")
    assert [r["partition_name"] for r in await sql_pop(conn, None, namespace="ns")] == ["c00000"]
