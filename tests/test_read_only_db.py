"""A database that answers but refuses writes (a hot standby, a primary being demoted in a failover,
``default_transaction_read_only``): every write is 503 ``db_unavailable`` with ``Retry-After``, never
500; the connection that met the refusal is dropped, not pooled again, so the first request after the
database is writable again is served; ``/health`` says ``database: read-only``. With
``target_session_attrs=read-write`` in ``DATABASE_URL`` (how a broker follows the primary of a
multi-host URL), a connect that finds no writable host is the same 503.

The read-only database is real: ``ALTER DATABASE ... SET default_transaction_read_only = on`` and
the broker's sessions ended, so each new session starts read-only, as on a standby."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.conftest import Broker
from tests.helpers import assert_error, push

OTHERS = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"


async def read_only(conn: asyncpg.Connection, name: str, on: bool) -> None:
    if on:
        await conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        await conn.fetch(OTHERS, name)  # the broker's sessions started writable; new ones start read-only
    else:
        await conn.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


def assert_unavailable(r: httpx.Response) -> None:
    assert_error(r, 503, "db_unavailable")
    assert r.headers.get("retry-after") == "1", r.headers


@pytest.mark.parametrize("attrs", ["", "target_session_attrs=read-write"], ids=["plain", "read-write"])
async def test_a_read_only_database_is_503_and_the_next_write_after_it_is_writable_is_served(
    start_broker: object, db_url: str, conn: asyncpg.Connection, attrs: str
) -> None:
    url = db_url + ("&" if "?" in db_url else "?") + attrs if attrs else db_url
    b: Broker = await start_broker(url, jobs_enabled=False)  # type: ignore[operator]
    name = await conn.fetchval("SELECT current_database()")
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await push(http, "ro", [{"payload": 0}])
        await read_only(conn, name, True)
        try:
            for n in range(1, 4):  # the session the refusal met is dropped each time; a new one is read-only too
                r = await http.post("/api/v1/push", json={"items": [{"queue": "ro", "payload": n}]})
                assert_unavailable(r)
            # (the first may still meet a session ended under it: "no connection")
            assert ("writable primary" if attrs else "read-only") in r.json()["error"], r.json()
            pop = await http.get("/api/v1/pop/queue/ro", params={"consumerGroup": "g"})
            assert_unavailable(pop)
            health = await http.get("/health")
            assert health.status_code == 503, health.text
            assert health.json()["database"] == ("read-only" if not attrs else "down"), health.json()
        finally:
            await read_only(conn, name, False)
        # no read-only session is left in the pool: the very next write is served
        r = await http.post("/api/v1/push", json={"items": [{"queue": "ro", "payload": "after"}]})
        assert r.status_code == 201, r.text
        assert (await http.get("/health")).json()["database"] == "up"
    rows = await conn.fetchval("SELECT sum(p.next_offset) FROM queen.log_partitions p")
    assert rows == 2  # the first push and the one after: the refused ones wrote nothing
