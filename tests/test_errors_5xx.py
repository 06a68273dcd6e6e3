"""5xx answers over real HTTP against a real broker: a 500 carries a request id and never the cause
(driver or PostgreSQL text), which one log line carries under the same id; a PostgreSQL that goes
away under a running broker (stopped, restarted, connections killed) is 503 + Retry-After on every
route, never 500, and the broker serves again once PostgreSQL is back."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import httpx
import pytest

from queen_pg.embedded_pg import EmbeddedPostgres
from queen_pg.errors import internal, log_value
from tests.conftest import Broker, broker_settings, free_port
from tests.helpers import eventually, push, until

SECRET = "s3cret-internal-detail"
LEASE = "/api/v1/lease/00000000-0000-0000-0000-000000000001/extend"


def internal_lines(caplog: pytest.LogCaptureFixture, rid: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "event=internal_error" in r.getMessage() and rid in r.getMessage()]


async def test_a_postgres_error_is_a_500_with_a_request_id_and_no_cause(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    await conn.execute(
        "CREATE OR REPLACE FUNCTION queen.lease_extend_v1(p_tenant text, p_lease_id uuid,"
        " p_now timestamptz DEFAULT NULL)"
        " RETURNS TABLE (renewed integer, expires_at timestamptz) LANGUAGE plpgsql AS $$"
        f" BEGIN RAISE EXCEPTION '{SECRET}' USING ERRCODE = 'XX000'; END $$"
    )
    with caplog.at_level(logging.ERROR, logger="queen_pg"):
        r = await http.post(LEASE)
    assert r.status_code == 500
    body = r.json()
    assert body["code"] == "internal" and body["requestId"]
    assert SECRET not in r.text and "XX000" not in r.text and "asyncpg" not in r.text
    lines = internal_lines(caplog, body["requestId"])
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert SECRET in lines[0].getMessage() and lines[0].exc_info is not None


async def test_a_python_error_is_a_500_with_a_request_id_and_one_log_line(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    # the procedure answers a shape the engine does not expect: a KeyError in Python, not a driver error
    await conn.execute("DROP FUNCTION queen.lease_extend_v1(text, uuid, timestamptz)")
    await conn.execute(
        "CREATE FUNCTION queen.lease_extend_v1(p_tenant text, p_lease_id uuid, p_now timestamptz DEFAULT NULL)"
        f' RETURNS TABLE ("{SECRET}" integer) LANGUAGE sql AS $$ SELECT 1 $$'
    )
    with caplog.at_level(logging.ERROR):
        r = await http.post(LEASE)
    assert r.status_code == 500
    body = r.json()
    assert body["code"] == "internal" and body["requestId"]
    assert SECRET not in r.text and "KeyError" not in r.text
    lines = internal_lines(caplog, body["requestId"])
    assert len(lines) == 1 and lines[0].exc_info is not None
    assert "path=/api/v1/lease/" in lines[0].getMessage()
    # no second, id-less copy of the traceback from the server's own error handler
    assert not [r for r in caplog.records if r.exc_info and r not in lines]


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers.get("retry-after") == "1"
    body = r.json()
    assert body["code"] in ("db_unavailable", "retry"), body
    assert "asyncpg" not in r.text and "Error" not in body["error"], body


async def calls(http: httpx.AsyncClient) -> list[httpx.Response]:
    return [
        await http.post("/api/v1/push", json={"items": [{"queue": "restart", "payload": {"n": 1}}]}),
        await http.get("/api/v1/pop/queue/restart", params={"consumerGroup": "g"}),
        await http.get("/api/v1/pop/queue/restart", params={"consumerGroup": "g", "wait": "true", "timeout": 500}),
        await http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}]}),
        await http.post(LEASE),
    ]


async def test_postgres_stopped_and_restarted_under_the_broker_is_503_then_recovers(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port(), fast=True)
    pg.start()
    b = Broker(broker_settings(pg.dsn(), jobs_enabled=False))
    try:
        await b.start()
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
            await push(http, "restart", [{"payload": {"n": 0}}])
            pg.stop()
            for r in await calls(http):
                assert_unavailable(r)
            health = await http.get("/health")
            assert health.status_code == 503 and health.json()["database"] == "down"

            pg.start()
            seen: list[int] = []

            async def serves() -> bool:
                r = await http.post("/api/v1/push", json={"items": [{"queue": "restart", "payload": {"n": 2}}]})
                seen.append(r.status_code)
                if r.status_code != 201:
                    assert_unavailable(r)
                return r.status_code == 201

            await until(serves, "the broker to serve again after PostgreSQL came back", within=30)
            assert 500 not in seen
            for r in await calls(http):  # every route works again, no dead pooled connection left
                assert r.status_code in (200, 201, 204), (r.status_code, r.text)
    finally:
        await b.stop()
        pg.stop()


async def test_killed_connections_are_503_never_500(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """pg_terminate_backend under the pool: the call that meets the dead connection got asyncpg's
    InternalClientError ("cannot switch to state 12") and answered 500; now 503, then served again."""
    await push(http, "killed", [{"payload": 1}])
    statuses: list[int] = []
    for _ in range(20):  # until a call has met a dead connection (the first round nearly always does)
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        for _ in range(4):
            r = await http.get("/api/v1/pop/queue/killed", params={"consumerGroup": "g", "autoAck": "true"})
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert_unavailable(r)
        if 503 in statuses:
            break
    assert 503 in statuses and 500 not in statuses, statuses
    assert set(statuses) <= {200, 204, 503}
    r = await http.get("/api/v1/pop/queue/killed", params={"consumerGroup": "g2"})
    assert r.status_code == 200


async def test_a_client_gone_mid_body_is_not_an_internal_error(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    head = (
        b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\n"
        b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    )
    with caplog.at_level(logging.DEBUG, logger="queen_pg"):
        _, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        try:
            writer.write(head + b'{"items"')
            await writer.drain()
            await eventually(lambda: bool(broker.server.server_state.tasks), "the push to start")
        finally:
            writer.close()  # also when the wait fails: a leaked writer warns in a later test
        await eventually(lambda: not broker.server.server_state.tasks, "the push to end")
    assert any("event=client_disconnect" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_clients_text_in_the_500_log_line_can_neither_end_it_nor_pass_for_a_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("queen_pg.app")
    with caplog.at_level(logging.ERROR, logger="queen_pg.app"):
        err = internal(log, ValueError("bad\nevent=forged"), path="/dashboard/a\x00b\nrequest_id=0 x=1")
    (line,) = internal_lines(caplog, err.body()["requestId"])
    text = line.getMessage()
    assert "\n" not in text and "\x00" not in text
    assert 'path="/dashboard/a\\u0000b\\nrequest_id=0 x=1"' in text
    assert 'error="ValueError: bad\\nevent=forged"' in text
    assert text.count("request_id=") == 2  # the real key, and the client's text inside the quoted path
    assert log_value("/api/v1/push") == "/api/v1/push"  # the usual path stays as it is
