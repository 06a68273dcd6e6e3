"""Ack and lease renew over real HTTP, and lease-expiry edges through the procedures with p_now."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from queen_pg.engine.codec import txn_hash
from tests.helpers import pop, push


def ack_body(m: dict, **extra: object) -> dict:  # type: ignore[type-arg]
    return {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], **extra}


async def test_completed_ack_advances_cursor_and_releases_lease(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"payload": i, "transactionId": f"t{i}"} for i in range(4)])
    ans = await pop(http, "q", batch=2, consumerGroup="g")
    r = await http.post(
        "/api/v1/ack/batch",
        json={"acknowledgments": [ack_body(m, status="completed") for m in ans["messages"]], "consumerGroup": "g"},
    )
    assert r.status_code == 200
    items = r.json()
    assert [i["success"] for i in items] == [True, True]
    assert [i["leaseReleased"] for i in items] == [False, True]
    row = await conn.fetchrow("SELECT cursor_offset, lease_id FROM queen.log_consumers")
    assert row["cursor_offset"] == 2 and row["lease_id"] is None
    nxt = await pop(http, "q", batch=10, consumerGroup="g")
    assert [m["data"] for m in nxt["messages"]] == [2, 3]


async def test_single_ack_answers_a_one_item_list(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "only"}])
    (m,) = (await pop(http, "q"))["messages"]
    r = await http.post(
        "/api/v1/ack", json={**ack_body(m), "status": "completed", "error": None, "consumerGroup": None}
    )
    assert r.status_code == 200
    (item,) = r.json()
    assert item["success"] is True and item["transactionId"] == "only" and item["leaseReleased"] is True


async def test_an_ack_out_of_order_commits_everything_below_it(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Replaces the 0.1 out-of-order `acked` array: acking offset 1 first commits 0 with it."""
    await push(http, "q", [{"payload": i, "transactionId": f"t{i}"} for i in range(3)])
    ms = (await pop(http, "q", batch=3))["messages"]
    (item,) = (await http.post("/api/v1/ack", json=ack_body(ms[1]))).json()
    assert item["success"] is True and item["noop"] is False and item["leaseReleased"] is False
    row = await conn.fetchrow("SELECT cursor_offset, lease_id FROM queen.log_consumers")
    assert row["cursor_offset"] == 2 and row["lease_id"] is not None
    (item,) = (await http.post("/api/v1/ack", json=ack_body(ms[0]))).json()
    assert item["success"] is True and item["noop"] is True
    (item,) = (await http.post("/api/v1/ack", json=ack_body(ms[2]))).json()
    assert item["leaseReleased"] is True
    row = await conn.fetchrow("SELECT cursor_offset, lease_id FROM queen.log_consumers")
    assert row["cursor_offset"] == 3 and row["lease_id"] is None


async def test_ack_with_someone_elses_lease_is_refused(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "q"))["messages"]
    (item,) = (await http.post("/api/v1/ack", json={**ack_body(m), "leaseId": str(uuid.uuid4())})).json()
    assert item["success"] is False and "lease" in item["error"]
    (item,) = (await http.post("/api/v1/ack", json={**ack_body(m), "leaseId": "garbage"})).json()
    assert item["success"] is False
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 0


async def test_ack_without_lease_skips_the_check(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "q"))["messages"]
    body = {"transactionId": "x", "partitionId": m["partitionId"]}
    (item,) = (await http.post("/api/v1/ack", json=body)).json()
    assert item["success"] is True
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 1


async def test_resent_ack_after_release_is_answered_alike(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "q"))["messages"]
    first = (await http.post("/api/v1/ack", json=ack_body(m))).json()[0]
    again = (await http.post("/api/v1/ack", json=ack_body(m))).json()[0]
    assert first["success"] is True and again["success"] is True and again["noop"] is True


async def test_unknown_message_and_partition_are_item_errors(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "q"))["messages"]
    r = await http.post(
        "/api/v1/ack/batch",
        json={
            "acknowledgments": [
                {"transactionId": "nope", "partitionId": m["partitionId"], "status": "completed"},
                {"transactionId": "x", "partitionId": "999999", "status": "completed"},
                {"transactionId": "x", "partitionId": "abc", "status": "completed"},
                {"transactionId": "x", "partitionId": m["partitionId"], "status": "completed"},
            ]
        },
    )
    assert r.status_code == 200
    assert [i["success"] for i in r.json()] == [False, False, False, True]
    assert [i["index"] for i in r.json()] == [0, 1, 2, 3]
    assert all(i["error"] for i in r.json()[:3])


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"partitionId": "1"}',
        b'{"transactionId": "x"}',
        b'{"transactionId": "x", "partitionId": "1", "status": "maybe"}',
        b'{"transactionId": 5, "partitionId": "1"}',
    ],
)
async def test_bad_ack_is_400(http: httpx.AsyncClient, body: bytes) -> None:
    r = await http.post("/api/v1/ack", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] in ("bad_request", "bad_json")


async def test_bad_batch_ack_is_400_and_changes_nothing(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "x"}])
    (m,) = (await pop(http, "q"))["messages"]
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ack_body(m), {"transactionId": 3}]})
    assert r.status_code == 400
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 0


async def test_lease_extend_with_no_body(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": 1}])
    lease = (await pop(http, "q"))["leaseId"]
    r = await http.post(f"/api/v1/lease/{lease}/extend")  # Content-Length: 0, no content type
    assert r.status_code == 200
    assert r.json()["success"] is True and r.json()["renewed"] == 1 and r.json()["newExpiresAt"]
    gone = await http.post(f"/api/v1/lease/{uuid.uuid4()}/extend")
    assert gone.status_code == 200 and gone.json()["success"] is False and gone.json()["renewed"] == 0


# --- lease expiry edges, time passed into the procedures ---------------------------------------

POP = "SELECT * FROM queen.pop_v1('default', 'q', NULL, NULL, NULL, 'g', 10, 1, $1, false, NULL, NULL, $2)"
ACK = "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7, $8)"


async def _ack(conn: asyncpg.Connection, pid: int, txn: str, lease: uuid.UUID, now: datetime) -> asyncpg.Record:
    rows = await conn.fetch(ACK, [pid], [txn_hash(txn)], [txn], [lease], ["g"], ["completed"], [None], now)
    return rows[0]


async def test_lease_edge_just_before_and_at_expiry(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await http.post("/api/v1/configure", json={"queue": "q", "options": {"leaseTime": 60}})
    res = await push(http, "q", [{"payload": 1, "transactionId": "a"}, {"payload": 2, "transactionId": "b"}])
    pid = int(res[0]["partitionId"])
    t0 = datetime.now(UTC)
    l1 = uuid.uuid4()
    assert len(await conn.fetch(POP, l1, t0)) == 1
    # not yet expired: nobody else can claim, and the holder's ack is accepted
    assert await conn.fetch(POP, uuid.uuid4(), t0 + timedelta(seconds=59.9)) == []
    ok = await _ack(conn, pid, "a", l1, t0 + timedelta(seconds=59.9))
    assert ok["success"] is True
    # at expiry: the holder's ack is refused, another consumer claims the rest with attempt 2
    late = await _ack(conn, pid, "b", l1, t0 + timedelta(seconds=60))
    assert late["success"] is False and "expired" in late["error"]
    l2 = uuid.uuid4()
    rows = await conn.fetch(POP, l2, t0 + timedelta(seconds=60))
    assert len(rows) == 1 and rows[0]["lease_start"] == 1 and rows[0]["attempts"] == 2
    assert rows[0]["redelivered_end"] == 2
    # the old holder is refused for good, the new one is accepted
    assert (await _ack(conn, pid, "b", l1, t0 + timedelta(seconds=61)))["success"] is False
    assert (await _ack(conn, pid, "b", l2, t0 + timedelta(seconds=61)))["success"] is True
