"""Configure, delete, health, and boot: schema applied by replicas at once, or skipped."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import psycopg
import pytest

from tests.conftest import Broker, PgServer, broker_settings, empty_database
from tests.helpers import EMPTY, counts, fetchval_once, pop, push


async def test_configure_creates_and_updates(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    opts = {
        "leaseTime": 120,
        "retryLimit": 5,
        "priority": 0,
        "delayedProcessing": 0,
        "windowBuffer": 0,
        "maxSize": 0,
        "retentionSeconds": 0,
        "completedRetentionSeconds": 0,
        "encryptionEnabled": False,
        "deadLetterQueue": True,
    }
    r = await http.post("/api/v1/configure", json={"queue": "cfg", "namespace": "ns", "task": "t", "options": opts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["options"]["leaseTime"] == 120 and body["options"]["retryLimit"] == 5
    assert body["namespace"] == "ns" and body["task"] == "t"
    r = await http.post("/api/v1/configure", json={"queue": "cfg", "options": {"retryLimit": 1}})
    assert r.json()["options"] == {**r.json()["options"], "leaseTime": 120, "retryLimit": 1}
    row = await conn.fetchrow("SELECT namespace, options FROM queen.queues WHERE name = 'cfg'")
    assert row["namespace"] == "ns" and '"deadLetterQueue": true' in row["options"]


@pytest.mark.parametrize(
    "body",
    [
        {"options": {}},
        {"queue": 3},
        {"queue": "q", "options": {"leaseTime": "long"}},
        {"queue": "q", "options": {"leaseTime": 0}},
        {"queue": "q", "options": {"retryLimit": -1}},
        {"queue": "q", "options": {"encryptionEnabled": "yes"}},  # true without a key: 409 (test_encryption)
        {"queue": "q", "options": []},
    ],
)
async def test_bad_configure_is_400_and_writes_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, body: dict[str, object]
) -> None:
    r = await http.post("/api/v1/configure", json=body)
    assert r.status_code == 400 and r.json()["code"] == "bad_request", r.text
    assert await counts(conn) == EMPTY


async def test_delete_queue_removes_everything(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "gone", [{"payload": i} for i in range(5)], "p1")
    await pop(http, "gone", consumerGroup="g")
    await push(http, "kept", [{"payload": 1}])
    r = await http.delete("/api/v1/resources/queues/gone")
    assert r.status_code == 200 and r.json()["deleted"] is True
    c = await counts(conn)
    assert c["queues"] == 1 and c["log_partitions"] == 1 and c["log_consumers"] == 0 and c["log_txns"] == 1
    again = await http.delete("/api/v1/resources/queues/gone")
    assert again.status_code == 200 and again.json()["deleted"] is False
    # pushing again recreates it from scratch
    res = await push(http, "gone", [{"payload": "new"}], "p1")
    assert res[0]["offset"] == 0


async def test_unknown_route_and_method_are_json(http: httpx.AsyncClient) -> None:
    r = await http.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = await http.get("/api/v1/push")
    assert r.status_code == 405 and r.json()["error"]


async def test_index_page_is_served(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert r.status_code == 200 and "queen-pg" in r.text


async def test_health_200_then_503_when_database_goes_away(
    pg_server: PgServer,
    start_broker,
    db_url: str,  # type: ignore[no-untyped-def]
) -> None:
    b = await start_broker()
    async with httpx.AsyncClient(base_url=b.url) as http:
        r = await http.get("/health")
        assert r.status_code == 200 and r.json()["database"] == "up"
        name = db_url.split("/")[3].split("?")[0]
        with psycopg.connect(pg_server.admin_url, autocommit=True) as c:
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")
        r = await http.get("/health")
        assert r.status_code == 503 and r.json()["code"] == "db_unavailable"
        r = await http.post("/api/v1/push", json={"items": [{"queue": "q"}]})
        assert r.status_code == 503 and r.json()["code"] == "db_unavailable"


async def test_three_replicas_boot_at_once_on_an_empty_database(pg_server: PgServer) -> None:
    url = empty_database(pg_server)
    brokers = [Broker(broker_settings(url)) for _ in range(3)]
    try:
        await asyncio.gather(*(b.start() for b in brokers))
        for b in brokers:
            async with httpx.AsyncClient(base_url=b.url) as http:
                assert (await http.get("/health")).status_code == 200
                res = await push(http, "boot", [{"payload": b.port}])
                assert res[0]["status"] == "queued"
        assert await fetchval_once(url, "SELECT next_offset FROM queen.log_partitions") == 3
    finally:
        for b in brokers:
            await b.stop()


async def test_apply_schema_off_leaves_the_database_alone(pg_server: PgServer) -> None:
    url = empty_database(pg_server)
    b = Broker(broker_settings(url, apply_schema=False))
    await b.start()
    try:
        assert await fetchval_once(url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'queen'") == 0
    finally:
        await b.stop()
