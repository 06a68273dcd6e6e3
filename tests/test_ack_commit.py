"""An ack is an offset commit (docs/wire.md#ack-offset-commit). Commit-through-N and the four honesty rules, each
with the official client (queen-mq 2.6.0) where it can express it, raw HTTP where it cannot, and the same rules
inside /transaction."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import pop, push, until


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


async def cursor(conn: asyncpg.Connection, group: str = "g") -> tuple[int, bool]:
    """(cursor_offset, lease held) of the only partition's cursor row of ``group``."""
    row = await conn.fetchrow(
        "SELECT cursor_offset, lease_id IS NOT NULL AS leased FROM queen.log_consumers WHERE consumer_group = $1",
        group,
    )
    assert row is not None
    return row["cursor_offset"], row["leased"]


async def fill(client: Queen, queue: str, n: int, retry_limit: int = 3) -> None:
    await client.queue(queue).config({"retry_limit": retry_limit}).create()
    await client.queue(queue).push([{"data": {"i": i}, "transactionId": f"{queue}-{i}"} for i in range(n)])


async def take(client: Queen, queue: str, n: int, group: str = "g") -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = await client.queue(queue).group(group).batch(n).wait(False).pop()
    assert len(msgs) == n
    return msgs


# --- commit through N ----------------------------------------------------------------------------


async def test_acking_n_commits_the_cursor_through_n(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "cn", 6)
        msgs = await take(client, "cn", 5)
        res = await client.ack(msgs[3], True, {"group": "g"})  # offsets 0..2 are completed with it
        assert res["success"] is True
        assert await cursor(conn) == (4, True)  # the lease still covers offset 4
        # the silently completed ones: a later ack of them is a noop, not an error
        res = await client.ack([msgs[1]], True, {"group": "g"})
        assert res["success"] is True and res["results"][0]["noop"] is True
        res = await client.ack([msgs[4]], True, {"group": "g"})
        assert res["results"][0]["noop"] is False and res["results"][0]["leaseReleased"] is True
        assert await cursor(conn) == (5, False)
        rest = await take(client, "cn", 1)
        assert rest[0]["data"] == {"i": 5}  # 0..4 never come back


# --- rule 1: a nack clamps ------------------------------------------------------------------------


async def test_a_nack_clamps_the_cursor_in_the_same_call(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "nc", 5)
        msgs = await take(client, "nc", 5)
        marked = [dict(m, _status=(False if m["data"]["i"] == 2 else True)) for m in msgs]
        res = await client.ack(marked, True, {"group": "g"})
        items = res["results"]
        assert res["success"] is True  # nothing refused: the nack applied, the later ones come back
        assert [i["noop"] for i in items] == [False, False, False, True, True]
        assert items[-1]["leaseReleased"] is True
        assert await cursor(conn) == (2, False)
        assert await conn.fetchval("SELECT failures FROM queen.log_consumers") == 1  # charged once
        again = await take(client, "nc", 3)  # the nacked message and everything after it
        assert [m["data"]["i"] for m in again] == [2, 3, 4]
        assert again[0]["retryCount"] == 1


async def test_retry_clamps_without_charging_and_failed_charges_once(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "rc", 3, retry_limit=1)
        msgs = await take(client, "rc", 3)
        await client.ack([msgs[0], dict(msgs[1], _status="retry"), msgs[2]], True, {"group": "g"})
        assert await cursor(conn) == (1, False)
        for _ in range(3):  # `retry` never spends the budget: no dead letter however often
            msgs = await take(client, "rc", 2)
            await client.ack([dict(msgs[0], _status="retry"), dict(msgs[1], _status=True)], True, {"group": "g"})
            assert await cursor(conn) == (1, False)
        assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0
        # two `failed` at offsets 1 and 2 in one call: one charge, against the lowest
        msgs = await take(client, "rc", 2)
        res = await client.ack(msgs, False, {"group": "g"})
        assert [i["dlq"] for i in res["results"]] == [False, False]
        assert await conn.fetchval("SELECT (fail_offset, failures)::text FROM queen.log_consumers") == "(1,1)"
        msgs = await take(client, "rc", 2)
        res = await client.ack(msgs, False, {"group": "g"})  # budget exhausted: 1 is dead, 2 comes back
        assert [i["dlq"] for i in res["results"]] == [True, False]
        assert await cursor(conn) == (2, False)
        assert [m["data"]["i"] for m in await take(client, "rc", 1)] == [2]


async def test_consume_with_a_failing_handler_redelivers_from_the_failure(broker: Broker) -> None:
    """The client's own consume loop: the failed message and the rest of its partition come back."""
    async with Queen(broker.url) as client:
        await fill(client, "cf", 6)
        seen: list[int] = []
        failed_once: set[int] = set()

        async def handle(m: dict[str, Any]) -> None:
            i = m["data"]["i"]
            seen.append(i)
            if i == 3 and i not in failed_once:
                failed_once.add(i)
                raise RuntimeError("boom")

        await client.queue("cf").group("g").batch(6).each().limit(7).wait(False).consume(handle)
        assert seen == [0, 1, 2, 3, 3, 4, 5]


# --- rule 2: a nack below the cursor is refused --------------------------------------------------


async def test_a_nack_below_the_cursor_is_refused_as_committed(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "nb", 4)
        msgs = await take(client, "nb", 4)
        assert (await client.ack(msgs[2], True, {"group": "g"}))["success"] is True  # cursor 3
        res = await client.ack(msgs[0], False, {"group": "g"})
        assert res["success"] is False and "committed" in res["error"]
        res = await client.ack([dict(msgs[1], _status="retry")], True, {"group": "g"})
        assert res["success"] is False and "committed" in res["error"]
        assert await cursor(conn) == (3, True)  # nothing moved, the lease still holds offset 3
        assert await conn.fetchval("SELECT failures FROM queen.log_consumers") == 0
        assert (await client.ack(msgs[3], True, {"group": "g"}))["success"] is True
        assert await cursor(conn) == (4, False)


# --- rule 3: a completed ack below the cursor is a noop ------------------------------------------


async def test_completed_below_the_cursor_is_noop_and_a_moving_ack_is_not(http: httpx.AsyncClient) -> None:
    """Raw HTTP: the client folds a single ack's answer into success/error and drops `noop`."""
    await push(http, "nt", [{"payload": i, "transactionId": f"t{i}"} for i in range(3)])
    ms = (await pop(http, "nt", batch=3))["messages"]
    body = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]} for m in ms]
    (moved,) = (await http.post("/api/v1/ack", json=body[1])).json()
    assert moved["success"] is True and moved["noop"] is False and moved["leaseReleased"] is False
    (below,) = (await http.post("/api/v1/ack", json=body[0])).json()
    assert below["success"] is True and below["noop"] is True and below["error"] is None
    (same,) = (await http.post("/api/v1/ack", json=body[1])).json()  # resent: answered alike
    assert same["success"] is True and same["noop"] is True
    (last,) = (await http.post("/api/v1/ack", json=body[2])).json()
    assert last["noop"] is False and last["leaseReleased"] is True
    (after,) = (await http.post("/api/v1/ack", json=body[2])).json()  # resent under the released lease
    assert after["success"] is True and after["noop"] is True


# --- rule 4: an unresolvable transactionId changes nothing ---------------------------------------


async def test_unresolvable_transaction_id_changes_nothing(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "un", 3)
        msgs = await take(client, "un", 3)
        ghost = dict(msgs[2], transactionId="never-pushed")
        res = await client.ack(ghost, True, {"group": "g"})
        assert res["success"] is False and "unresolvable" in res["error"]
        res = await client.ack(dict(ghost, _status=False), False, {"group": "g"})  # a nack of it as well
        assert res["success"] is False and "unresolvable" in res["error"]
        assert await cursor(conn) == (0, True)
        assert await conn.fetchval("SELECT failures FROM queen.log_consumers") == 0
        # in one call with the real batch: the ghost is refused, the batch is acked as if it were not there
        res = await client.ack([*msgs, ghost], True, {"group": "g"})
        assert res["success"] is False and "unresolvable" in res["error"]
        assert [i["success"] for i in res["results"]] == [True, True, True, False]
        assert await cursor(conn) == (3, False)


async def test_unresolvable_in_another_partition(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """A transactionId that exists, but in another partition, is unresolvable in this one."""
    await push(http, "up", [{"payload": 1, "transactionId": "a"}], partition="A")
    await push(http, "up", [{"payload": 1, "transactionId": "b"}], partition="B")
    a = (await pop(http, "up", partition="A"))["messages"][0]
    (item,) = (await http.post("/api/v1/ack", json={**a, "transactionId": "b", "status": "completed"})).json()
    assert item["success"] is False and "unresolvable" in item["error"]
    (item,) = (await http.post("/api/v1/ack", json={**a, "status": "completed"})).json()
    assert item["success"] is True


# --- the same rules inside /transaction ----------------------------------------------------------


async def ack_and_push(client: Queen, m: dict[str, Any]) -> Any:
    """One transaction: ack ``m`` for group g and push a message naming its offset to tc-out."""
    tx = client.transaction().ack(m, "completed", {"consumer_group": "g"})
    return await tx.queue("tc-out").push([{"data": {"from": m["data"]["i"]}}]).commit()


async def test_transaction_ack_commits_through_n(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "tc", 4)
        msgs = await take(client, "tc", 4)
        res = await ack_and_push(client, msgs[2])
        assert res and res["results"][0]["noop"] is False
        assert await cursor(conn) == (3, True)
        # the silently committed offset 1, under its own live lease: a noop, and the step commits
        res = await ack_and_push(client, msgs[1])
        assert res and res["results"][0]["noop"] is True
        assert (
            await conn.fetchval(
                "SELECT sum(next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id "
                "WHERE q.name = 'tc-out'"
            )
            == 2
        )


async def test_transaction_nack_clamps(broker: Broker, conn: asyncpg.Connection) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "tn", 4)
        msgs = await take(client, "tn", 4)
        res = await (
            client.transaction()
            .ack(msgs[0], "completed", {"consumer_group": "g"})
            .ack(msgs[1], "failed", {"consumer_group": "g"})
            .ack(msgs[2], "completed", {"consumer_group": "g"})
            .commit()
        )
        assert res and [r["noop"] for r in res["results"]] == [False, False, True]
        assert await cursor(conn) == (1, False)
        assert [m["data"]["i"] for m in await take(client, "tn", 3)] == [1, 2, 3]


async def refused_with_its_push(
    client: Queen, conn: asyncpg.Connection, m: dict[str, Any], status: str, error: str
) -> None:
    """One transaction acking ``m`` with ``status`` for group g and pushing to tr-out is refused with
    ``error`` and rolls back whole: tr-out was never created."""
    with pytest.raises(Exception, match=error):
        await client.transaction().ack(m, status, {"consumer_group": "g"}).queue("tr-out").push([{"data": 1}]).commit()
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'tr-out'") == 0


async def test_transaction_nack_below_the_cursor_rolls_back_as_committed(
    broker: Broker, conn: asyncpg.Connection
) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "tb", 3)
        msgs = await take(client, "tb", 3)
        assert (await client.ack(msgs[1], True, {"group": "g"}))["success"] is True
        await refused_with_its_push(client, conn, msgs[0], "failed", "committed")
        assert await cursor(conn) == (2, True)


async def test_transaction_unresolvable_ack_rolls_back_and_the_batch_stays_ackable(
    broker: Broker, conn: asyncpg.Connection
) -> None:
    async with Queen(broker.url) as client:
        await fill(client, "tu", 2)
        msgs = await take(client, "tu", 2)
        await refused_with_its_push(client, conn, dict(msgs[0], transactionId="ghost"), "completed", "unresolvable")
        assert await cursor(conn) == (0, True)
        res = await client.transaction().ack(msgs, "completed", {"consumer_group": "g"}).commit()
        assert res and await cursor(conn) == (2, False)


async def test_transaction_without_lease_below_the_cursor_is_refused(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """A lease-less ack (the 0.x client's transaction acks) below the cursor: nothing proves that this
    worker committed it, so the bundle's side effects must not apply (exactly-once of the step)."""
    await push(http, "tl", [{"payload": 1, "transactionId": "a"}])
    (m,) = (await pop(http, "tl"))["messages"]
    await http.post("/api/v1/ack", json={"transactionId": "a", "partitionId": m["partitionId"]})
    r = await http.post(
        "/api/v1/transaction",
        json={
            "operations": [
                {"type": "ack", "transactionId": "a", "partitionId": m["partitionId"]},
                {"type": "push", "items": [{"queue": "tl-out", "transactionId": "o", "payload": 1}]},
            ],
            "requiredLeases": [],
        },
    )
    assert r.status_code == 200
    assert r.json()["reason"] == "rejected_ack" and "already committed" in r.json()["error"]
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'tl-out'") == 0


async def test_a_committed_step_resent_after_its_lease_ran_out_is_a_duplicate(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Regression (test_crash stalled on it): the step committed, its answer was lost (broker killed),
    and the lease ran out before the client's resend. The offset is below the cursor under the row's
    own last lease, so the resend is answered as committed (duplicate), not `lease expired` (which
    left the message committed and its step never counted)."""
    assert (await http.post("/api/v1/configure", json={"queue": "rs", "options": {"leaseTime": 1}})).status_code == 200
    await push(http, "rs", [{"payload": i, "transactionId": f"in-{i}"} for i in range(2)])
    ms = (await pop(http, "rs", batch=2))["messages"]
    body = {
        "operations": [
            {"type": "ack", "transactionId": "in-0", "partitionId": ms[0]["partitionId"], "leaseId": ms[0]["leaseId"]},
            {"type": "push", "items": [{"queue": "rs-out", "transactionId": "out-0", "payload": 0}]},
        ],
        "requiredLeases": [],
    }
    assert (await http.post("/api/v1/transaction", json=body)).json()["success"] is True
    await until(
        lambda: conn.fetchval("SELECT clock_timestamp() > lease_expires_at FROM queen.log_consumers"),
        "the lease to run out",
    )
    again = (await http.post("/api/v1/transaction", json=body)).json()
    assert again["success"] is False and again["reason"] == "duplicate"
    (item,) = (await http.post("/api/v1/ack", json={**ms[0], "status": "completed"})).json()
    assert item["success"] is True and item["noop"] is True
    (late,) = (await http.post("/api/v1/ack", json={**ms[1], "status": "completed"})).json()  # at the cursor
    assert late["success"] is False and "expired" in late["error"]
