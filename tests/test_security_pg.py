"""The embedded PostgreSQL's roles and authentication: the broker works as an owner without
SUPERUSER; TCP wants scram with the generated password (0600 file) and never admits the superuser."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from queen_pg.embedded_pg import EmbeddedPostgres
from tests.conftest import Broker, broker_settings, free_port


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    p = EmbeddedPostgres(tmp_path / "pg", port=free_port(), tcp=True, fast=True)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def tcp(pg: EmbeddedPostgres, user: str, password: str | None) -> psycopg.Connection:
    kw = {"password": password} if password is not None else {}
    return psycopg.connect(
        host="127.0.0.1", port=pg.port, user=user, dbname="queen", connect_timeout=5, autocommit=True, **kw
    )


def test_tcp_needs_the_generated_password_and_never_admits_the_superuser(pg: EmbeddedPostgres) -> None:
    mode = stat.S_IMODE(pg.password_path.stat().st_mode)
    assert mode == 0o600
    password = pg.tcp_password()
    assert len(password) >= 32
    with pytest.raises(psycopg.OperationalError):
        tcp(pg, pg.app_user, None).close()  # no password: refused (never trust)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        tcp(pg, pg.app_user, "wrong").close()
    for pw in (None, password, ""):
        with pytest.raises(psycopg.OperationalError):
            tcp(pg, pg.user, pw).close()  # the superuser has no TCP entry at all
    with tcp(pg, pg.app_user, password) as conn:
        row = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user")
        assert row.fetchone() == (False, False, False)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
    hba = (pg.pgdata / "pg_hba.conf").read_text()
    assert "trust" not in [line.split()[-1] for line in hba.splitlines() if line.startswith("host")]


def test_password_survives_restart_and_old_data_dirs_are_handed_over(pg: EmbeddedPostgres) -> None:
    password = pg.tcp_password()
    with psycopg.connect(pg.admin_dsn(), autocommit=True) as conn:  # what an older version left behind
        conn.execute("CREATE SCHEMA IF NOT EXISTS queen AUTHORIZATION queen")
        conn.execute("CREATE TABLE queen.legacy (v int)")
        conn.execute("CREATE FUNCTION queen.legacy_f() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute("ALTER SCHEMA queen OWNER TO queen")
    pg.stop()
    pg.start()
    assert pg.tcp_password() == password
    with tcp(pg, pg.app_user, password) as conn:
        owners = conn.execute(
            "SELECT (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'queen'),"
            " (SELECT relowner::regrole::text FROM pg_class WHERE oid = 'queen.legacy'::regclass),"
            " (SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'queen.legacy_f'::regproc)"
        ).fetchone()
        assert owners == (pg.app_user,) * 3
        conn.execute("DROP TABLE queen.legacy")  # an owner may


async def test_broker_runs_as_the_non_superuser_owner(pg: EmbeddedPostgres) -> None:
    b = Broker(broker_settings(pg.dsn(), apply_schema=True))  # applies sql/ as queen_app
    await b.start()
    try:
        async with httpx.AsyncClient(base_url=b.url) as http:
            r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": {"a": 1}}]})
            assert r.status_code == 201, r.text
            r = await http.get("/api/v1/pop/queue/q", params={"batch": 1})
            assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"a": 1}
    finally:
        await b.stop()
    with psycopg.connect(pg.dsn()) as conn:
        assert conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (
            "queen_app",
            False,
        )
