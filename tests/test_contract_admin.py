"""docs/wire.md#message-detail (one message's detail with consumerGroups) with the official client's admin.get_message,
and docs/wire.md#legacy-admin (the 0.x admin calls: dead-letter one message now, clear a queue) over raw HTTP; the
0.x client
itself drives them in tests/test_e2e_client_015.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import pop, push

DETAIL_FIELDS = {
    "id", "transactionId", "partitionId", "queue", "partition", "namespace", "task", "status", "payload",
    "isEncrypted", "traceId", "producerSub", "createdAt", "errorMessage", "retryCount", "leaseExpiresAt",
    "queueConfig", "consumerGroups",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


async def configure(http: httpx.AsyncClient, queue: str, **options: Any) -> None:
    r = await http.post("/api/v1/configure", json={"queue": queue, **options})
    assert r.status_code == 200, r.text


def iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- docs/wire.md#message-detail --------------------------------------------------------------------------------------


async def test_get_message_answers_the_listed_fields_and_one_entry_per_group(broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=broker.url) as http, Queen(broker.url) as client:
        await configure(http, "md", namespace="billing", task="invoice", options={"leaseTime": 120, "retryLimit": 5})
        await client.queue("md").push([{"data": {"n": i}, "transactionId": f"m{i}"} for i in range(3)])
        # group "auto": at-most-once pop of m0
        (auto,) = await client.queue("md").group("auto").commit_on_delivery().batch(1).wait(False).pop()
        assert auto["transactionId"] == "m0"
        # queue mode: m0 leased, unacked
        (held,) = await client.queue("md").batch(1).wait(False).pop()
        pid = held["partitionId"]
        # group "dead": m0 dead-lettered by an operator
        r = await http.post(f"/api/v1/messages/{pid}/m0/dlq", params={"consumerGroup": "auto"})
        assert r.status_code == 409  # "auto" already consumed it
        await client.queue("md").group("dead").batch(1).wait(False).pop()
        r = await http.post(f"/api/v1/messages/{pid}/m0/dlq", json={"consumerGroup": "dead", "error": "poison"})
        assert r.status_code == 200, r.text

        m0 = await client.admin.get_message(pid, "m0")
        assert DETAIL_FIELDS <= set(m0), DETAIL_FIELDS - set(m0)
        assert (m0["transactionId"], m0["id"], m0["partitionId"]) == ("m0", held["id"], pid)
        assert (m0["queue"], m0["partition"], m0["namespace"], m0["task"]) == ("md", "Default", "billing", "invoice")
        assert m0["payload"] == m0["data"] == {"n": 0}
        assert (m0["isEncrypted"], m0["producerSub"], m0["traceId"]) == (False, None, None)
        assert m0["status"] == "dead_letter" and m0["errorMessage"] == "poison"
        assert m0["queueConfig"]["leaseTime"] == 120 and m0["queueConfig"]["retryLimit"] == 5
        assert m0["createdAt"] == held["createdAt"]
        groups = {g["name"]: g for g in m0["consumerGroups"]}
        assert set(groups) == {"__QUEUE_MODE__", "auto", "dead"}
        assert all(set(g) == {"name", "consumed", "leaseExpiresAt"} for g in groups.values())
        assert (groups["auto"]["consumed"], groups["auto"]["leaseExpiresAt"]) == (True, None)  # autoAck
        assert (groups["dead"]["consumed"], groups["dead"]["leaseExpiresAt"]) == (True, None)
        qm = groups["__QUEUE_MODE__"]
        assert qm["consumed"] is False and qm["leaseExpiresAt"] is not None
        left = iso(qm["leaseExpiresAt"]) - datetime.now(UTC)
        assert timedelta(seconds=100) < left <= timedelta(seconds=120)  # the queue's leaseTime
        assert m0["leaseExpiresAt"] == qm["leaseExpiresAt"]

        # m2: nobody has it; "dead" group's cursor is at 1 (m0 done), queue mode's lease covers m0 only
        m2 = await client.admin.get_message(pid, "m2")
        assert m2["status"] == "pending" and m2["leaseExpiresAt"] is None and m2["errorMessage"] is None
        assert [(g["name"], g["consumed"], g["leaseExpiresAt"]) for g in m2["consumerGroups"]] == [
            ("__QUEUE_MODE__", False, None),
            ("auto", False, None),
            ("dead", False, None),
        ]


async def test_status_goes_pending_processing_completed(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("st").push([{"data": 1, "transactionId": "only"}])
        r = await client.queue("st").batch(1).wait(False).pop()
        pid = r[0]["partitionId"]
        await client.ack(r[0], False)  # a nack: redelivered, counts a retry
        (again,) = await client.queue("st").batch(1).wait(False).pop()
        leased = await client.admin.get_message(pid, "only")
        assert leased["status"] == "processing" and leased["retryCount"] == 1
        assert [g["name"] for g in leased["consumerGroups"]] == ["__QUEUE_MODE__"]
        await client.ack(again, True)
        done = await client.admin.get_message(pid, "only")
        assert done["status"] == "completed" and done["leaseExpiresAt"] is None
        assert done["consumerGroups"] == [{"name": "__QUEUE_MODE__", "consumed": True, "leaseExpiresAt": None}]


async def test_a_message_no_group_reads_yet_is_pending_with_no_groups(http: httpx.AsyncClient) -> None:
    await push(http, "ng", [{"payload": 1, "transactionId": "t"}])
    pid = await _partition_id(http, "ng")
    r = await http.get(f"/api/v1/messages/{pid}/t")
    assert r.status_code == 200 and r.json()["status"] == "pending" and r.json()["consumerGroups"] == []
    assert (await http.get(f"/api/v1/messages/{pid}/nope")).status_code == 404
    assert (await http.get(f"/api/v1/messages/{int(pid) + 1000}/t")).status_code == 404
    assert (await http.get("/api/v1/messages/abc/t")).status_code == 400


async def _partition_id(http: httpx.AsyncClient, queue: str, partition: str = "Default") -> str:
    r = await http.get("/api/v1/messages", params={"queue": queue, "partition": partition, "limit": 1})
    assert r.status_code == 200, r.text
    pid: str = r.json()["messages"][0]["partitionId"]
    return pid


# --- docs/wire.md#legacy-admin move one message to the DLQ ------------------------------------------------------------


async def test_move_to_dlq_defaults_to_queue_mode_and_leaves_other_groups(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "mv", [{"payload": i, "transactionId": f"t{i}"} for i in range(2)])
    pid = await _partition_id(http, "mv")
    # queue mode and group "other" both have cursors (a pop creates them), nothing leased
    assert await pop(http, "mv", consumerGroup="other", batch=1, autoAck=True)  # other: t0 done
    assert (await http.post(f"/api/v1/messages/{pid}/t0/dlq")).status_code == 404  # queue mode has no cursor yet
    qm = await pop(http, "mv", batch=1)  # queue mode: t0 leased
    r = await http.post(f"/api/v1/messages/{pid}/t1/dlq", json={})
    assert r.status_code == 200, r.text
    moved = r.json()
    assert (moved["status"], moved["consumerGroup"], moved["queueMode"], moved["offset"]) == ("moved", None, True, 1)
    assert moved["leaseReleased"] is False  # the lease covers t0, which is still pending
    dlq = (await http.get("/api/v1/dlq", params={"queue": "mv"})).json()
    assert [(m["transactionId"], m["consumerGroup"]) for m in dlq["messages"]] == [("t1", None)]
    assert dlq["messages"][0]["errorMessage"] == "moved to the dead-letter queue by an operator"
    # a second move is a conflict and writes nothing
    again = await http.post(f"/api/v1/messages/{pid}/t1/dlq")
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 1
    # queue mode: acking t0 finishes the partition (t1 is settled); "other" still reads t1
    ack = await http.post(
        "/api/v1/ack",
        json={"transactionId": "t0", "partitionId": pid, "leaseId": qm["leaseId"]},
    )
    assert ack.json()[0]["success"] is True
    assert await pop(http, "mv", batch=10) is None
    (t1,) = (await pop(http, "mv", consumerGroup="other", batch=10))["messages"]
    assert t1["transactionId"] == "t1"


async def test_move_to_dlq_for_a_named_group_releases_a_lease_it_empties(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "mg", [{"payload": i, "transactionId": f"t{i}"} for i in range(2)])
    (m,) = (await pop(http, "mg", consumerGroup="g", batch=1))["messages"]
    pid = m["partitionId"]
    r = await http.post(f"/api/v1/messages/{pid}/t0/dlq?consumerGroup=g", json={"consumerGroup": "ignored"})
    assert r.status_code == 200, r.text
    assert (r.json()["consumerGroup"], r.json()["leaseReleased"]) == ("g", True)
    (d,) = (await http.get("/api/v1/dlq", params={"consumerGroup": "g"})).json()["messages"]
    assert d["transactionId"] == "t0" and d["queue"] == "mg"
    # the lease is gone at once: the next message is claimable now, not after leaseTime
    (n,) = (await pop(http, "mg", consumerGroup="g", batch=5))["messages"]
    assert n["transactionId"] == "t1"
    row = await conn.fetchrow("SELECT cursor_offset, acked_total FROM queen.log_consumers WHERE consumer_group='g'")
    assert (row["cursor_offset"], row["acked_total"]) == (1, 1)


async def test_move_to_dlq_drops_the_retry_budget_spent_on_that_message(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """A message nacked once (its retry budget in use: fail_offset, failures) and then dead-lettered by
    hand: the cursor passes it and the budget goes with it, as an ack's commit would leave it."""
    await push(http, "mf", [{"payload": i, "transactionId": f"t{i}"} for i in range(2)])
    (m,) = (await pop(http, "mf", consumerGroup="g", batch=1))["messages"]
    pid = m["partitionId"]
    nack = {"transactionId": "t0", "partitionId": pid, "leaseId": m["leaseId"], "status": "failed"}
    assert (await http.post("/api/v1/ack", json={**nack, "consumerGroup": "g"})).json()[0]["success"] is True
    budget = (
        "SELECT cursor_offset, fail_offset, failures, acked_total, lease_id"
        " FROM queen.log_consumers WHERE consumer_group = 'g'"
    )
    assert tuple(await conn.fetchrow(budget)) == (0, 0, 1, 0, None)
    r = await http.post(f"/api/v1/messages/{pid}/t0/dlq?consumerGroup=g")
    assert r.status_code == 200, r.text
    assert (r.json()["offset"], r.json()["leaseReleased"]) == (0, False)  # the nack had released the lease
    assert tuple(await conn.fetchrow(budget)) == (1, None, 0, 1, None)


async def test_move_to_dlq_above_the_cursor_is_passed_over_not_committed_through(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """An ack is an offset commit (docs/wire.md#ack-offset-commit): dead-lettering t1 while g's cursor is at t0 must not
    complete t0; g passes over t1 (a log_passes row), t1 reads as consumed for g, and a redelivery of
    t0 skips t1."""
    await push(http, "ma", [{"payload": i, "transactionId": f"t{i}"} for i in range(3)])
    first = await pop(http, "ma", consumerGroup="g", batch=1)
    (t0,) = first["messages"]
    pid = t0["partitionId"]
    r = await http.post(f"/api/v1/messages/{pid}/t1/dlq", params={"consumerGroup": "g"})
    assert r.status_code == 200, r.text
    assert (r.json()["offset"], r.json()["leaseReleased"]) == (1, False)  # t0 is still pending under it
    row = await conn.fetchrow("SELECT cursor_offset, lease_id FROM queen.log_consumers WHERE consumer_group='g'")
    assert row["cursor_offset"] == 0 and row["lease_id"] is not None
    assert await conn.fetch("SELECT consumer_group, msg_offset FROM queen.log_passes") == [("g", 1)]
    detail = (await http.get(f"/api/v1/messages/{pid}/t1")).json()
    assert detail["status"] == "dead_letter"
    assert detail["consumerGroups"] == [{"name": "g", "consumed": True, "leaseExpiresAt": None}]
    assert (await http.get(f"/api/v1/messages/{pid}/t0")).json()["consumerGroups"][0]["consumed"] is False
    listed = (await http.get("/api/v1/messages", params={"queue": "ma", "consumerGroup": "g"})).json()
    states = {m["transactionId"]: m["status"] for m in listed["messages"]}
    assert states == {"t0": "leased", "t1": "dead", "t2": "pending"}
    again = await http.post(f"/api/v1/messages/{pid}/t1/dlq", params={"consumerGroup": "g"})
    assert again.status_code == 409 and "dead-lettered" in again.json()["error"]
    # a nack of t0 redelivers t0, and the redelivery passes over t1
    nack = await http.post(
        "/api/v1/ack",
        json={"transactionId": "t0", "partitionId": pid, "leaseId": t0["leaseId"], "consumerGroup": "g",
              "status": "failed"},
    )  # fmt: skip
    assert nack.json()[0]["success"] is True
    redo = await pop(http, "ma", consumerGroup="g", batch=10)
    assert [m["transactionId"] for m in redo["messages"]] == ["t0", "t2"]
    done = await http.post(
        "/api/v1/ack/batch",
        json={"acknowledgments": [
            {"transactionId": t, "partitionId": pid, "leaseId": redo["messages"][0]["leaseId"],
             "consumerGroup": "g", "status": "completed"} for t in ("t0", "t2")]},
    )  # fmt: skip
    assert all(a["success"] for a in done.json()), done.text
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group='g'") == 3
    assert await conn.fetchval("SELECT count(*) FROM queen.log_passes") == 0
    assert await pop(http, "ma", consumerGroup="g", batch=10) is None


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("/api/v1/messages/abc/t0/dlq", {}, 400),
        ("/api/v1/messages/999999/t0/dlq", {}, 404),
        ("/api/v1/messages/{pid}/nope/dlq", {}, 404),
        ("/api/v1/messages/{pid}/t0/dlq", {"consumerGroup": "never-popped"}, 404),
        ("/api/v1/messages/{pid}/t0/dlq", {"consumerGroup": "a\x01b"}, 400),
    ],
)
async def test_move_to_dlq_refusals_write_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, path: str, params: dict[str, str], status: int
) -> None:
    await push(http, "mr", [{"payload": 0, "transactionId": "t0"}])
    (m,) = (await pop(http, "mr", batch=1))["messages"]
    r = await http.post(path.format(pid=m["partitionId"]), params=params)
    assert r.status_code == status, r.text
    assert r.json()["error"]
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 0


async def test_move_to_dlq_bad_bodies_are_400(http: httpx.AsyncClient) -> None:
    await push(http, "mb", [{"payload": 0, "transactionId": "t0"}])
    (m,) = (await pop(http, "mb", batch=1))["messages"]
    base = f"/api/v1/messages/{m['partitionId']}/t0/dlq"
    for content in (b"[", b"[]", b'{"consumerGroup": 5}', b'{"error": "x\\u0000y"}'):
        r = await http.post(base, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400, (content, r.text)


# --- docs/wire.md#legacy-admin clear a queue --------------------------------------------------------------------------


async def test_clear_drops_messages_keeps_queue_config_and_consistent_cursors(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await configure(http, "cq", options={"leaseTime": 77})
    await push(http, "cq", [{"payload": i, "transactionId": f"a{i}"} for i in range(3)], partition="p1")
    await push(http, "cq", [{"payload": i, "transactionId": f"b{i}"} for i in range(2)], partition="p2")
    held = await pop(http, "cq", consumerGroup="g", partition="p1", batch=2)  # a live lease on p1
    await pop(http, "cq", partition="p2", batch=1, autoAck=True)  # queue mode: b0 consumed
    (d,) = (await pop(http, "cq", consumerGroup="d", partition="p2", batch=1))["messages"]
    assert (await http.post(f"/api/v1/messages/{d['partitionId']}/b0/dlq?consumerGroup=d")).status_code == 200
    # g passes over a2 (dead-lettered above its cursor while its lease holds a0, a1)
    p1 = held["messages"][0]["partitionId"]
    assert (await http.post(f"/api/v1/messages/{p1}/a2/dlq?consumerGroup=g")).status_code == 200
    assert await conn.fetchval("SELECT count(*) FROM queen.log_passes") == 1

    r = await http.delete("/api/v1/queues/cq/clear")
    assert r.status_code == 200, r.text
    res = r.json()
    assert (res["success"], res["status"], res["queue"], res["partition"]) == (True, "cleared", "cq", None)
    assert (res["partitions"], res["messagesDropped"], res["deadLettersDropped"], res["leasesBroken"]) == (2, 5, 2, 1)
    for table in ("log_segments", "log_txns", "log_dlq", "log_passes"):
        assert await conn.fetchval(f"SELECT count(*) FROM queen.{table}") == 0, table
    # the queue, its configuration, partitions and groups stay
    q = (await http.get("/api/v1/resources/queues/cq")).json()
    assert q["config"]["leaseTime"] == 77
    assert await conn.fetchval("SELECT count(*) FROM queen.log_partitions") == 2
    assert sorted(await conn.fetchval("SELECT array_agg(name) FROM queen.log_groups")) == ["__QUEUE_MODE__", "d", "g"]
    # every cursor at the end, no lease: nothing pending for anyone
    bad = await conn.fetch(
        "SELECT c.* FROM queen.log_consumers c JOIN queen.log_partitions p ON p.id = c.partition_id "
        "WHERE c.cursor_offset <> p.next_offset OR c.lease_id IS NOT NULL OR c.attempts <> 0"
    )
    assert bad == []
    for group in ("g", "d", None):
        params = {"batch": 10, "partitions": 5} | ({"consumerGroup": group} if group else {})
        assert await pop(http, "cq", **params) is None
    # the old lease holder's ack finds nothing and changes nothing
    m = held["messages"][0]
    ack = await http.post(
        "/api/v1/ack",
        json={"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
              "consumerGroup": "g"},
    )  # fmt: skip
    assert ack.json()[0]["success"] is False
    # new pushes are read by every group, offsets continue (never reused)
    await push(http, "cq", [{"payload": "new", "transactionId": "a0"}], partition="p1")  # not a duplicate now
    (n,) = (await pop(http, "cq", consumerGroup="g", batch=10, partitions=5))["messages"]
    assert (n["transactionId"], n["offset"], n["data"]) == ("a0", 3, "new")
    assert (await pop(http, "cq", batch=10, partitions=5))["messages"][0]["offset"] == 3


async def test_clear_one_partition_and_refusals(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "cp", [{"payload": 1}], partition="p1")
    await push(http, "cp", [{"payload": 2}, {"payload": 3}], partition="p2")
    r = await http.delete("/api/v1/queues/cp/clear", params={"partition": "p1"})
    assert r.status_code == 200 and (r.json()["partitions"], r.json()["messagesDropped"]) == (1, 1)
    got = await pop(http, "cp", batch=10, partitions=5)
    assert [m["data"] for m in got["messages"]] == [2, 3]
    before = await conn.fetchval("SELECT count(*) FROM queen.log_segments")
    assert (await http.delete("/api/v1/queues/nope/clear")).status_code == 404
    assert (await http.delete("/api/v1/queues/cp/clear", params={"partition": "nope"})).status_code == 404
    assert (await http.delete("/api/v1/queues/cp/clear", params={"partition": "a\x00b"})).status_code == 400
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == before
    # an empty queue clears to zero
    await configure(http, "empty")
    r = await http.delete("/api/v1/queues/empty/clear")
    assert r.status_code == 200 and (r.json()["partitions"], r.json()["messagesDropped"]) == (0, 0)
