"""The embedded PostgreSQL's roles and authentication: the broker works as an owner without
SUPERUSER; the socket and TCP want scram with the generated passwords (0600 files), TCP never admits
the superuser, and a data dir whose superuser had no password gets one."""

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


def bare(pg: EmbeddedPostgres, user: str, password: str = "") -> psycopg.Connection:
    """Over the Unix socket with ``password`` and no password file: what any local process could try."""
    return psycopg.connect(
        host=str(pg.socket_dir), port=pg.port, user=user, dbname="queen", password=password,
        passfile=str(pg.data_dir / "no-such-file"), connect_timeout=5, autocommit=True,
    )  # fmt: skip


def assert_socket_wants_passwords(pg: EmbeddedPostgres) -> None:
    su_password = pg.superuser_password()
    assert su_password is not None and len(su_password) >= 32
    for path in (pg.password_path, pg.superuser_password_path, pg.passfile_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for user in (pg.user, pg.app_user):
        for pw in ("", "wrong"):
            with pytest.raises(psycopg.OperationalError):
                bare(pg, user, pw).close()
    with bare(pg, pg.user, su_password) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)
    with bare(pg, pg.app_user, pg.tcp_password()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (pg.app_user,)
    hba = (pg.pgdata / "pg_hba.conf").read_text()
    assert "trust" not in [line.split()[-1] for line in hba.splitlines() if line and not line.startswith("#")]


def test_the_socket_wants_the_password_of_either_role(pg: EmbeddedPostgres) -> None:
    """Regression: the socket trusted every role, so any account that reached the socket (the
    `postgres` account of a root install) was the superuser without a password."""
    assert_socket_wants_passwords(pg)
    with psycopg.connect(pg.dsn()) as conn, psycopg.connect(pg.admin_dsn()) as admin:  # the DSNs name the pgpass
        assert conn.execute("SELECT current_user").fetchone() == (pg.app_user,)
        assert admin.execute("SELECT current_user").fetchone() == (pg.user,)
    assert pg.superuser_password() not in pg.dsn() + pg.admin_dsn() + pg.psql_command()


def test_a_data_dir_whose_superuser_had_no_password_is_upgraded(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.admin_dsn(), autocommit=True) as conn:  # as an older version left it
        conn.execute("ALTER ROLE queen PASSWORD NULL")
        conn.execute("CREATE TABLE public.kept (v int)")
        conn.execute("INSERT INTO public.kept VALUES (7)")
    pg.stop()
    pg.superuser_password_path.unlink(missing_ok=True)
    pg.passfile_path.unlink(missing_ok=True)
    app_password = pg.tcp_password()
    pg.start()
    assert pg.tcp_password() == app_password
    assert_socket_wants_passwords(pg)
    with psycopg.connect(pg.dsn()) as conn:
        assert conn.execute("SELECT v FROM public.kept").fetchone() == (7,)
    su_password = pg.superuser_password()
    pg.stop()
    pg.start()  # and the next start is an ordinary one
    assert pg.superuser_password() == su_password
    assert_socket_wants_passwords(pg)


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
