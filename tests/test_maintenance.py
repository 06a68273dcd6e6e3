"""Maintenance switches over real HTTP: push maintenance refuses pushes and pushing transactions (503
``maintenance`` + Retry-After), pop maintenance answers pops empty at once, both stored in PostgreSQL
and seen by a second broker on the same database within a second; the refresher keeps the last
switches when the database does not answer; the official client sees the 503."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from queen import Queen

from queen_pg.db.pool import Database
from queen_pg.engine.maintenance import Maintenance
from queen_pg.jobs.maintenance import MaintenanceRefresher
from queen_pg.settings import Settings
from tests.conftest import Broker
from tests.helpers import eventually, pop, push

PUSH_SWITCH = "/api/v1/system/maintenance"
POP_SWITCH = "/api/v1/system/maintenance/pop"
ITEM = {"items": [{"queue": "mq", "payload": {"x": 1}}]}


async def flip(http: httpx.AsyncClient, path: str, enabled: bool) -> Any:
    r = await http.post(path, json={"enabled": enabled})
    assert r.status_code == 200, r.text
    return r.json()


def assert_maintenance(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "maintenance" and "maintenance" in r.json()["error"]
    assert r.headers["retry-after"] == "1"


async def test_switches_start_off_and_answer_both_flags(http: httpx.AsyncClient) -> None:
    for path in (PUSH_SWITCH, POP_SWITCH):
        r = await http.get(path)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["maintenanceMode"] is False and body["popMaintenanceMode"] is False and body["updatedAt"] is None
    on = await flip(http, POP_SWITCH, True)
    assert on["success"] is True and on["popMaintenanceMode"] is True and on["maintenanceMode"] is False
    assert on["updatedAt"].endswith("Z")
    assert (await http.get(PUSH_SWITCH)).json()["popMaintenanceMode"] is True
    status = (await http.get("/api/v1/status")).json()
    assert status["maintenance"] == {"push": False, "pop": True}


async def test_push_maintenance_refuses_pushes_only(http: httpx.AsyncClient) -> None:
    await push(http, "mq", [{"payload": 0, "transactionId": "before"}])
    await flip(http, PUSH_SWITCH, True)
    assert_maintenance(await http.post("/api/v1/push", json=ITEM))
    tx_push = {"operations": [{"type": "push", "items": [{"queue": "mq", "payload": 1}]}]}
    assert_maintenance(await http.post("/api/v1/transaction", json=tx_push))
    # pops, acks and transactions without pushes go on: a backlog drains during maintenance
    got = await pop(http, "mq", batch=1)
    (m,) = got["messages"]
    tx_ack = {"operations": [{"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"]}]}
    r = await http.post("/api/v1/transaction", json=tx_ack)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert (await http.get("/api/v1/dlq")).status_code == 200

    await flip(http, PUSH_SWITCH, False)
    r = await http.post("/api/v1/push", json=ITEM)
    assert r.status_code == 201, r.text


async def test_pop_maintenance_answers_empty_at_once(broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=broker.url, timeout=5) as http:  # a 30 s long-poll would time out
        await push(http, "pq", [{"payload": i} for i in range(3)])
        await flip(http, POP_SWITCH, True)
        # a 30 s long-poll answered inside the client's 5 s timeout: it did not wait
        r = await http.get("/api/v1/pop/queue/pq", params={"wait": "true", "timeout": 30000})
        assert r.status_code == 204 and r.content == b""
        r = await http.get("/api/v1/pop", params={"namespace": "ns", "wait": "true", "timeout": 30000})
        assert r.status_code == 204
        assert_bad = await http.get("/api/v1/pop/queue/pq", params={"batch": "x"})
        assert assert_bad.status_code == 400  # parameters are still checked
        await push(http, "pq", [{"payload": 3}])  # pushes go on
        await flip(http, POP_SWITCH, False)
        got = await pop(http, "pq", batch=10)
        assert [m["data"] for m in got["messages"]] == [0, 1, 2, 3]


async def test_a_parked_pop_claims_nothing_once_pop_maintenance_is_on(start_broker: Any) -> None:
    b = await start_broker(pop_poll_interval_ms=60_000)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        waiting = asyncio.create_task(http.get("/api/v1/pop/queue/pm", params={"wait": "true", "timeout": 20000}))
        await eventually(lambda: b.app.state.queen.waiters.parked == 1, "the pop to park")
        await flip(http, POP_SWITCH, True)
        await push(http, "pm", [{"payload": "held back"}])  # wakes the parked pop
        r = await waiting
        assert r.status_code == 204
        await flip(http, POP_SWITCH, False)
        got = await pop(http, "pm")
        assert [m["data"] for m in got["messages"]] == ["held back"] and got["messages"][0]["deliveryAttempt"] == 1


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"", "bad_request"),
        (b'{"enabled": "yes"}', "bad_request"),
        (b"{}", "bad_request"),
        (b"{on", "bad_json"),
    ],
)
async def test_switch_body_errors(http: httpx.AsyncClient, content: bytes, code: str) -> None:
    for path in (PUSH_SWITCH, POP_SWITCH):
        r = await http.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == code, r.text
    assert (await http.get(PUSH_SWITCH)).json()["maintenanceMode"] is False  # nothing was written


async def test_a_second_broker_sees_the_switch_within_a_second(start_broker: Any) -> None:
    a: Broker = await start_broker()
    b: Broker = await start_broker(jobs_enabled=False)  # the refresher runs without jobs as well
    b_state = b.app.state.queen
    async with httpx.AsyncClient(base_url=a.url) as ha, httpx.AsyncClient(base_url=b.url) as hb:
        await flip(ha, PUSH_SWITCH, True)
        assert a.app.state.queen.maintenance.push is True  # the flipping replica: at once
        # the refresher re-reads every 500 ms: B follows within one interval plus a query
        await eventually(lambda: b_state.maintenance.push, "broker B to see push maintenance", within=1.5)
        assert_maintenance(await hb.post("/api/v1/push", json=ITEM))

        await flip(hb, POP_SWITCH, True)
        await flip(hb, PUSH_SWITCH, False)
        a_state = a.app.state.queen
        await eventually(lambda: a_state.maintenance.pop and not a_state.maintenance.push, "broker A", within=1.5)
        assert (await ha.get("/api/v1/pop/queue/mq")).status_code == 204
        assert (await ha.post("/api/v1/push", json=ITEM)).status_code == 201


async def test_refresher_keeps_the_last_switches_when_the_database_is_gone(db_url: str) -> None:
    cache = Maintenance(push=True, pop=True)
    gone = Database("postgresql://127.0.0.1:1/nothing", 2)  # never opened: every call fails
    refresher = MaintenanceRefresher(gone, cache, 0.1)
    assert await refresher.refresh_once() is False
    assert cache.push is True and cache.pop is True and refresher.failing is True
    db = Database(db_url, 2)
    await db.open(apply_schema=False)
    try:
        refresher.db = db
        assert await refresher.refresh_once() is True
        assert cache.push is False and cache.pop is False and refresher.failing is False
    finally:
        await db.close()


def test_refresh_interval_is_at_most_a_second() -> None:
    with pytest.raises(ValidationError):
        Settings(database_url="postgresql://x/y", maintenance_refresh_ms=1500)


async def test_official_client_push_in_maintenance(broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=broker.url) as http:
        await flip(http, PUSH_SWITCH, True)
    async with Queen(broker.url, retry_attempts=1) as client:
        with pytest.raises(httpx.HTTPStatusError) as err:
            await client.queue("mq").push([{"data": {"x": 1}}])
        assert err.value.response.status_code == 503
        assert err.value.code == "maintenance"  # type: ignore[attr-defined]
