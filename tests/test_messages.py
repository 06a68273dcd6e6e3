"""Messages over real HTTP: browse (decoded, paged, by partition/offset/time, with a group's state), get
one with its state per group, delete (settle for every group, drop the hash), the DLQ retry beside
them; and the official client's message helpers (queen-mq 2.6.0)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import assert_error, pop, push, push_at

M = "/api/v1/messages"


async def listing(http: httpx.AsyncClient, **params: Any) -> Any:
    r = await http.get(M, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def ack(http: httpx.AsyncClient, m: dict[str, Any], status: str, group: str | None = None) -> Any:
    body = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": status}
    if group is not None:
        body.update(consumerGroup=group, leaseId=m["leaseId"])
    r = await http.post("/api/v1/ack", json=body)
    assert r.status_code == 200, r.text
    return r.json()[0]


async def _fill(http: httpx.AsyncClient) -> None:
    """p1: t0..t4 in one push (one segment); p2: u0, u1 then u2 with a duplicate of u1 (a dropped frame)."""
    await push(http, "q", [{"payload": {"n": i}, "transactionId": f"t{i}"} for i in range(5)], "p1")
    await push(http, "q", [{"payload": {"u": i}, "transactionId": f"u{i}"} for i in range(2)], "p2")
    res = await push(
        http, "q", [{"payload": "dup", "transactionId": "u1"}, {"payload": {"u": 2}, "transactionId": "u2"}], "p2"
    )
    assert [r["status"] for r in res] == ["duplicate", "queued"]


async def test_browse_orders_pages_and_filters(http: httpx.AsyncClient) -> None:
    await _fill(http)
    newest = await listing(http, queue="q")
    assert newest["total"] == 8 and newest["order"] == "desc" and newest["limit"] == 100
    assert [m["transactionId"] for m in newest["messages"]] == ["u2", "u1", "u0", "t4", "t3", "t2", "t1", "t0"]
    u2 = newest["messages"][0]
    assert u2["data"] == {"u": 2} and u2["partition"] == "p2" and u2["offset"] == 2 and u2["queue"] == "q"
    assert u2["id"] and u2["createdAt"].endswith("Z") and u2["traceId"] is None and "status" not in u2

    oldest = await listing(http, queue="q", order="asc")
    assert [m["transactionId"] for m in oldest["messages"]] == ["t0", "t1", "t2", "t3", "t4", "u0", "u1", "u2"]
    for order in ("asc", "desc"):  # pages cut through segments and still tile the whole list
        full = [m["transactionId"] for m in (await listing(http, queue="q", order=order))["messages"]]
        paged: list[str] = []
        for offset in range(0, 8, 3):
            page = await listing(http, queue="q", order=order, limit=3, offset=offset)
            assert page["total"] == 8
            paged += [m["transactionId"] for m in page["messages"]]
        assert paged == full
    assert (await listing(http, queue="q", offset=8))["messages"] == []

    p1 = await listing(http, queue="q", partition="p1", fromOffset=1, toOffset=3, order="asc")
    assert p1["total"] == 2 and [m["data"] for m in p1["messages"]] == [{"n": 1}, {"n": 2}]
    tail = await listing(http, queue="q", partition="p2", fromOffset=1, order="asc")
    assert [m["transactionId"] for m in tail["messages"]] == ["u1", "u2"]


async def test_browse_by_time(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    await push_at(conn, "tq", ["old0", "old1"], past)
    await push(http, "tq", [{"payload": 1, "transactionId": "new0"}])
    cut = (past + timedelta(hours=1)).isoformat()
    before = await listing(http, queue="tq", to=cut)
    assert [m["transactionId"] for m in before["messages"]] == ["old1", "old0"] and before["total"] == 2
    after = await listing(http, queue="tq", **{"from": cut})
    assert [m["transactionId"] for m in after["messages"]] == ["new0"]


async def test_browse_with_a_groups_state(http: httpx.AsyncClient) -> None:
    await push(http, "s", [{"payload": i, "transactionId": f"m{i}"} for i in range(5)])
    first = await pop(http, "s", consumerGroup="g", batch=2)
    await ack(http, first["messages"][0], "completed", "g")  # m0 consumed, m1 still leased
    assert await pop(http, "s", consumerGroup="g", batch=3) is None  # m1 still leased by the first pop
    await ack(http, first["messages"][1], "dlq", "g")  # m1 dead
    await pop(http, "s", consumerGroup="g", batch=1)  # m2 leased
    body = await listing(http, queue="s", consumerGroup="g", order="asc")
    states = {m["transactionId"]: m["status"] for m in body["messages"]}
    assert states == {"m0": "consumed", "m1": "dead", "m2": "leased", "m3": "pending", "m4": "pending"}
    assert body["messages"][0]["consumerGroup"] == "g"


async def _states_in_segments(http: httpx.AsyncClient) -> dict[str, str]:
    """Queue f, group g; partition a in three segments, b in one. The expected state of each message."""
    for batch in (range(3), range(3, 6), range(6, 8)):
        await push(http, "f", [{"payload": i, "transactionId": f"a{i}"} for i in batch], "a")
    await push(http, "f", [{"payload": i, "transactionId": f"b{i}"} for i in range(3)], "b")
    first = await pop(http, "f", partition="a", consumerGroup="g", batch=2)
    await ack(http, first["messages"][0], "completed", "g")  # a0 consumed (below the cursor)
    await ack(http, first["messages"][1], "dlq", "g")  # a1 dead (below the cursor too)
    leased = await pop(http, "f", partition="a", consumerGroup="g", batch=2)
    assert [m["transactionId"] for m in leased["messages"]] == ["a2", "a3"]  # a lease across two segments
    r = await http.delete(f"{M}/{leased['messages'][0]['partitionId']}/a5")
    assert r.status_code == 200 and r.json()["groupsSettled"] == 1  # a5: passed over (log_passes), above the cursor
    await pop(http, "f", partition="b", consumerGroup="g", batch=1, autoAck=True)  # b0 consumed
    expected = {"a0": "consumed", "a1": "dead", "a2": "leased", "a3": "leased", "a4": "pending", "a5": "consumed"}
    expected |= {"a6": "pending", "a7": "pending", "b0": "consumed", "b1": "pending", "b2": "pending"}
    everything = await listing(http, queue="f", consumerGroup="g", order="asc")
    assert {m["transactionId"]: m["status"] for m in everything["messages"]} == expected
    return expected


async def _walk(http: httpx.AsyncClient, limit: int, **params: Any) -> tuple[list[str], set[int]]:
    """Every page of a listing, `limit` at a time: the transactionIds in order and the totals seen."""
    seen: list[str] = []
    totals: set[int] = set()
    for offset in range(0, 20, limit):
        body = await listing(http, queue="f", consumerGroup="g", limit=limit, offset=offset, **params)
        assert all(m["status"] == params["status"] for m in body["messages"]), body
        seen += [m["transactionId"] for m in body["messages"]]
        totals.add(body["total"])
    return seen, totals


async def test_browse_filtered_by_a_groups_status_pages_over_the_filtered_set(http: httpx.AsyncClient) -> None:
    expected = await _states_in_segments(http)
    unfiltered = [m["transactionId"] for m in (await listing(http, queue="f", order="asc"))["messages"]]
    for status in ("consumed", "leased", "pending", "dead"):
        want = [t for t in unfiltered if expected[t] == status]
        for limit in (1, 2, 3):
            asc, totals = await _walk(http, limit, status=status, order="asc")
            assert (asc, totals) == (want, {len(want)}), (status, limit)
            desc, totals = await _walk(http, limit, status=status, order="desc")
            assert (desc, totals) == (want[::-1], {len(want)}), (status, limit)
    # with the other filters: one partition, an offset range
    pending_a = await listing(http, queue="f", consumerGroup="g", status="pending", partition="a", order="asc")
    assert [m["transactionId"] for m in pending_a["messages"]] == ["a4", "a6", "a7"] and pending_a["total"] == 3
    ranged = await listing(http, queue="f", consumerGroup="g", status="consumed", fromOffset=1, toOffset=6, order="asc")
    assert [m["transactionId"] for m in ranged["messages"]] == ["a5"] and ranged["total"] == 1
    gone = await listing(http, queue="f", consumerGroup="g", status="dead", offset=5)
    assert (gone["messages"], gone["total"]) == ([], 1)  # a page past the end keeps the total


async def test_browse_filtered_by_status_in_queue_mode(http: httpx.AsyncClient) -> None:
    await push(http, "qm", [{"payload": i, "transactionId": f"m{i}"} for i in range(4)])
    await pop(http, "qm", batch=1, autoAck=True)  # m0 consumed
    await pop(http, "qm", batch=2)  # m1, m2 leased
    leased = await listing(http, queue="qm", consumerGroup="__QUEUE_MODE__", status="leased", order="asc")
    assert [m["transactionId"] for m in leased["messages"]] == ["m1", "m2"] and leased["total"] == 2
    assert leased["messages"][0]["consumerGroup"] is None
    pending = await listing(http, queue="qm", consumerGroup="__QUEUE_MODE__", status="pending")
    assert [m["transactionId"] for m in pending["messages"]] == ["m3"] and pending["total"] == 1


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({}, 400, "bad_request"),
        ({"queue": "nope"}, 404, "not_found"),
        ({"queue": "q", "partition": "nope"}, 404, "not_found"),
        ({"queue": "q", "consumerGroup": "ghost"}, 404, "not_found"),
        ({"queue": "q", "fromOffset": "x"}, 400, "bad_request"),
        ({"queue": "q", "from": "yesterday"}, 400, "bad_request"),
        ({"queue": "q", "order": "sideways"}, 400, "bad_request"),
        ({"queue": "q", "status": "pending"}, 400, "bad_request"),  # a status needs consumerGroup
        ({"queue": "q", "consumerGroup": "g", "status": "done"}, 400, "bad_request"),
        ({"queue": "q", "consumerGroup": "g", "status": ""}, 400, "bad_request"),
        ({"queue": "q", "consumerGroup": "ghost", "status": "pending"}, 404, "not_found"),
        ({"queue": "q", "limit": 0}, 400, "bad_request"),
        ({"queue": "x" * 256}, 413, "name_too_long"),
    ],
)
async def test_browse_errors(http: httpx.AsyncClient, params: dict[str, Any], status: int, code: str) -> None:
    await push(http, "q", [{"payload": 1}])
    assert_error(await http.get(M, params=params), status, code)


@pytest.mark.parametrize(
    "params",
    [
        {"fromOffset": 5, "toOffset": 5},
        {"fromOffset": 1, "toOffset": 0},
        {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
    ],
)
async def test_an_empty_range_is_an_empty_page(http: httpx.AsyncClient, params: dict[str, Any]) -> None:
    """A range at or below its start selects nothing (JSON Schema cannot relate two parameters, so the
    broker does not refuse what the schema calls valid)."""
    await push(http, "q", [{"payload": i} for i in range(7)])
    r = await http.get(M, params={"queue": "q", **params})
    assert r.status_code == 200, r.text
    assert (r.json()["messages"], r.json()["total"]) == ([], 0)


async def test_get_one_message_with_its_state_per_group(http: httpx.AsyncClient) -> None:
    res = await push(
        http, "g1", [{"payload": {"k": [1, 2]}, "transactionId": "a/b"}, {"payload": 2, "transactionId": "c"}]
    )
    pid = res[0]["partitionId"]
    await pop(http, "g1", consumerGroup="fast", batch=2, autoAck=True)
    await pop(http, "g1", consumerGroup="slow", batch=1)
    await pop(http, "g1", consumerGroup="idle", batch=1, autoAck=True)  # a done, c pending
    r = await http.get(f"{M}/{pid}/a/b")  # a transactionId with a slash
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["data"] == {"k": [1, 2]} and m["transactionId"] == "a/b" and m["id"] == res[0]["messageId"]
    assert m["offset"] == 0 and m["queue"] == "g1" and m["partitionId"] == pid and m["deadLetters"] == []
    assert {g["name"]: g["state"] for g in m["groups"]} == {"fast": "consumed", "idle": "consumed", "slow": "leased"}
    c = (await http.get(f"{M}/{pid}/c")).json()
    assert {g["name"]: g["state"] for g in c["groups"]} == {"fast": "consumed", "idle": "pending", "slow": "pending"}

    assert_error(await http.get(f"{M}/{pid}/nope"), 404, "not_found")
    assert_error(await http.get(f"{M}/999999/c"), 404, "not_found")
    assert_error(await http.get(f"{M}/abc/c"), 400, "bad_request")
    assert_error(await http.get(f"{M}/-3/c"), 400, "bad_request")


async def test_delete_settles_for_every_group_and_drops_the_hash(http: httpx.AsyncClient) -> None:
    res = await push(http, "d", [{"payload": i, "transactionId": f"x{i}"} for i in range(3)])
    pid = res[0]["partitionId"]
    leased = await pop(http, "d", consumerGroup="a", batch=1)  # a leases x0
    await pop(http, "d", consumerGroup="b", batch=3, autoAck=True)  # b is done with everything
    await pop(http, "d", batch=1, autoAck=True)  # queue mode: x0 done, x1 next

    r = await http.delete(f"{M}/{pid}/x0")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["deleted"] is True and body["offset"] == 0 and body["transactionId"] == "x0"
    assert body["groupsSettled"] == 1 and body["leasesReleased"] == 1 and body["deadLettersRemoved"] == 0
    # group a's lease covered only x0: released; a goes on with x1
    nxt = await pop(http, "d", consumerGroup="a", batch=5)
    assert [m["transactionId"] for m in nxt["messages"]] == ["x1", "x2"]
    refused = await ack(http, leased["messages"][0], "completed", "a")
    assert refused["success"] is False  # its transactionId is gone

    r = await http.delete(f"{M}/{pid}/x1")  # pending in queue mode, leased by a (with x2)
    assert r.json()["groupsSettled"] == 2 and r.json()["leasesReleased"] == 0
    qm = await pop(http, "d", batch=5)
    assert [m["transactionId"] for m in qm["messages"]] == ["x2"]

    assert_error(await http.get(f"{M}/{pid}/x0"), 404, "not_found")
    assert_error(await http.delete(f"{M}/{pid}/x0"), 404, "not_found")
    assert_error(await http.delete(f"{M}/999999/x0"), 404, "not_found")
    assert_error(await http.delete(f"{M}/zero/x0"), 400, "bad_request")
    again = await push(http, "d", [{"payload": "again", "transactionId": "x0"}])
    assert again[0]["status"] == "queued"  # no longer a duplicate
    listed = await listing(http, queue="d", consumerGroup="b", order="asc")
    assert [m["transactionId"] for m in listed["messages"]] == ["x0", "x1", "x2", "x0"]  # bytes stay in the log


async def test_a_transaction_id_naming_two_messages(http: httpx.AsyncClient) -> None:
    r = await http.post("/api/v1/configure", json={"queue": "tw", "options": {"dedupWindowSeconds": 0}})
    assert r.status_code == 200, r.text
    first = await push(http, "tw", [{"payload": "one", "transactionId": "same"}])
    await pop(http, "tw", consumerGroup="g", batch=1, autoAck=True)  # g is done with the first one
    await push(http, "tw", [{"payload": "two", "transactionId": "same"}, {"payload": "three", "transactionId": "t"}])
    pid = first[0]["partitionId"]
    got = (await http.get(f"{M}/{pid}/same")).json()
    assert got["data"] == "two" and got["offset"] == 1 and got["offsets"] == [0, 1]  # the newest
    await pop(http, "tw", batch=1)  # queue mode leases "one" (offset 0)
    deleted = (await http.delete(f"{M}/{pid}/same")).json()
    assert deleted["offsets"] == [0, 1] and deleted["offset"] == 1
    assert deleted["groupsSettled"] == 2 and deleted["leasesReleased"] == 1
    qm = await pop(http, "tw", batch=10)
    assert [m["data"] for m in qm["messages"]] == ["three"]
    g = await pop(http, "tw", consumerGroup="g", batch=10)
    assert [m["data"] for m in g["messages"]] == ["three"]


async def test_delete_removes_dead_letters_and_retry_route_still_answers(start_broker: Any) -> None:
    b = await start_broker(jobs_enabled=False)  # no dlq_fill: the dead letter's payload stays uncopied
    async with httpx.AsyncClient(base_url=b.url) as http:
        await _dead_letter_then_delete(http)


async def _dead_letter_then_delete(http: httpx.AsyncClient) -> None:
    res = await push(http, "r", [{"payload": {"v": 1}, "transactionId": "dead"}])
    pid = res[0]["partitionId"]
    m = (await pop(http, "r", consumerGroup="g", batch=1))["messages"][0]
    assert (await ack(http, m, "dlq", "g"))["dlq"] is True
    got = (await http.get(f"{M}/{pid}/dead")).json()
    assert got["groups"] == [{"name": "g", "queueMode": False, "cursor": 1, "state": "dead"}]
    assert got["deadLetters"][0]["consumerGroup"] == "g"
    # POST .../retry reaches the DLQ route (not the GET/DELETE ones): requeued at once, for g only
    r = await http.post(f"{M}/{pid}/dead/retry")
    assert r.status_code == 200 and r.json()["status"] == "requeued" and r.json()["consumerGroups"] == ["g"]
    m = (await pop(http, "r", consumerGroup="g", batch=1))["messages"][0]
    assert m["offset"] == 1 and m["data"] == {"v": 1}
    assert (await ack(http, m, "dlq", "g"))["dlq"] is True
    deleted = (await http.delete(f"{M}/{pid}/dead")).json()
    assert deleted["deadLettersRemoved"] == 1 and deleted["groupsSettled"] == 0
    assert (await http.get("/api/v1/dlq", params={"queue": "r"})).json()["total"] == 0
    assert_error(await http.post(f"{M}/{pid}/dead/retry"), 404, "not_found")


async def test_official_client_message_helpers(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("cm").create()
        pushed = await client.queue("cm").push([{"data": {"i": i}, "transactionId": f"cm-{i}"} for i in range(3)])
        pid = pushed[0]["partitionId"]
        first = await client.queue("cm").batch(1).wait(False).pop()  # queue mode now exists: cm-0 leased
        listed = await client.admin.list_messages(queue="cm", order="asc", limit=2)
        assert listed["total"] == 3 and [m["data"] for m in listed["messages"]] == [{"i": 0}, {"i": 1}]
        one = await client.admin.get_message(pid, "cm-1")
        assert one["data"] == {"i": 1} and one["groups"] == [
            {"name": None, "queueMode": True, "cursor": 0, "state": "pending"}
        ]
        deleted = await client.admin.delete_message(pid, "cm-1")
        assert deleted["deleted"] is True and deleted["groupsSettled"] == 1
        await client.ack(first[0], True)
        got = await client.queue("cm").batch(10).wait(False).pop()
        assert [m["transactionId"] for m in got] == ["cm-2"]
