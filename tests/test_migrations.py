"""Both ways to a current schema give one catalog: ``alembic upgrade head`` (queen_pg.migrate, the
``alembic`` command line) and boot's ``apply_sql``. See migrations/versions/0001_baseline.py.

The comparison reads the catalog of schema ``queen`` (alembic's ``alembic_version`` table lives in
``public`` and is ignored) into ``{category: {key: description}}`` and diffs the rendered lines."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import asyncpg
import httpx
import psycopg
import pytest

from queen_pg.db.apply import apply_sql
from queen_pg.migrate import sqlalchemy_url, upgrade
from tests.conftest import ROOT, PgServer, empty_database, free_port
from tests.test_encryption import K1, count_decodes, framed_pop

SCHEMA = "queen"
HEAD = "0012"  # the newest revision under migrations/versions/
IGNORED_RELATIONS = ("alembic_version",)

Snapshot = dict[str, dict[str, str]]

# the FROM and WHERE of the two index queries below
_INDEXES = """
          FROM pg_index x
          JOIN pg_class i ON i.oid = x.indexrelid
          JOIN pg_class c ON c.oid = x.indrelid
          JOIN pg_namespace n ON n.oid = i.relnamespace
         WHERE n.nspname = %(schema)s AND c.relname <> ALL (%(ignored)s)
"""
# Each query returns (key, description) rows; %(schema)s and %(ignored)s are bound by psycopg.
CATALOG_QUERIES: dict[str, str] = {
    "relation": """
        SELECT c.relname,
               format('kind=%%s persistence=%%s reloptions=%%s acl=%%s', c.relkind, c.relpersistence,
                      coalesce(c.reloptions::text, '-'), coalesce(c.relacl::text, '-'))
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND c.relkind <> 'i' AND c.relkind <> 'I'
           AND c.relname <> ALL (%(ignored)s)
    """,
    "column": """
        SELECT format('%%s.%%s', c.relname, a.attname),
               format('position=%%s type=%%s not_null=%%s default=%%s storage=%%s identity=%%s '
                      'generated=%%s collation=%%s',
                      row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                      format_type(a.atttypid, a.atttypmod), a.attnotnull,
                      coalesce(pg_get_expr(d.adbin, d.adrelid), '-'), a.attstorage,
                      coalesce(nullif(a.attidentity, ''), '-'), coalesce(nullif(a.attgenerated, ''), '-'),
                      coalesce(co.collname, '-'))
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
         WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
           AND c.relname <> ALL (%(ignored)s)
    """,
    "constraint": """
        SELECT format('%%s.%%s', coalesce(c.relname, t.typname), k.conname),
               format('type=%%s deferrable=%%s deferred=%%s validated=%%s %%s', k.contype,
                      k.condeferrable, k.condeferred, k.convalidated, pg_get_constraintdef(k.oid))
          FROM pg_constraint k
          JOIN pg_namespace n ON n.oid = k.connamespace
          LEFT JOIN pg_class c ON c.oid = k.conrelid
          LEFT JOIN pg_type t ON t.oid = k.contypid
         WHERE n.nspname = %(schema)s AND coalesce(c.relname, '') <> ALL (%(ignored)s)
    """,
    "index": "SELECT format('%%s.%%s', c.relname, i.relname), pg_get_indexdef(i.oid)" + _INDEXES,
    "index options": "SELECT format('%%s.%%s', c.relname, i.relname), coalesce(i.reloptions::text, '-')" + _INDEXES,
    "sequence": """
        SELECT c.relname,
               format('type=%%s start=%%s increment=%%s min=%%s max=%%s cache=%%s cycle=%%s',
                      format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
                      s.seqcache, s.seqcycle)
          FROM pg_sequence s
          JOIN pg_class c ON c.oid = s.seqrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s
    """,
    "function": """
        SELECT format('%%s(%%s)', p.proname, pg_get_function_identity_arguments(p.oid)),
               CASE WHEN p.prokind = 'a' THEN 'aggregate returning '
                                              || format_type(p.prorettype, NULL)
                    ELSE pg_get_functiondef(p.oid) END
                 || E'\n' || format('acl=%%s', coalesce(p.proacl::text, '-'))
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = %(schema)s
    """,
    "trigger": """
        SELECT format('%%s.%%s', c.relname, g.tgname), pg_get_triggerdef(g.oid)
          FROM pg_trigger g
          JOIN pg_class c ON c.oid = g.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND NOT g.tgisinternal
    """,
    "type": """
        SELECT t.typname,
               format('typtype=%%s base=%%s labels=%%s', t.typtype, format_type(t.typbasetype, t.typtypmod),
                      (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                         FROM pg_enum e WHERE e.enumtypid = t.oid))
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = %(schema)s
           AND (t.typtype IN ('d', 'e', 'r', 'm')
                OR t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
    """,
    "comment": """
        SELECT format('%%s %%s', d.classoid::regclass, d.objsubid)
                 || ' ' || coalesce(pg_describe_object(d.classoid, d.objoid, d.objsubid), '?'),
               d.description
          FROM pg_description d
         WHERE d.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = %(schema)s::text::regnamespace
                              AND relname <> ALL (%(ignored)s)
                            UNION ALL
                            SELECT oid FROM pg_proc WHERE pronamespace = %(schema)s::text::regnamespace
                            UNION ALL
                            SELECT oid FROM pg_namespace WHERE nspname = %(schema)s::text)
    """,
    "extension": """
        SELECT e.extname, format('schema=%%s', e.extnamespace::regnamespace) FROM pg_extension e
    """,
}


def catalog(url: str) -> Snapshot:
    """Schema ``queen`` of the database at ``url`` as ``{category: {key: description}}``."""
    snapshot: Snapshot = {}
    params = {"schema": SCHEMA, "ignored": list(IGNORED_RELATIONS)}
    with psycopg.connect(url) as conn:
        for category, query in CATALOG_QUERIES.items():
            rows = conn.execute(query, params).fetchall()
            entries = {str(key): str(value) for key, value in rows}
            assert len(entries) == len(rows), f"duplicate keys in catalog category {category!r}"
            snapshot[category] = entries
    return snapshot


def render(snapshot: Snapshot) -> list[str]:
    lines: list[str] = []
    for category in sorted(snapshot):
        for key in sorted(snapshot[category]):
            head, *rest = snapshot[category][key].splitlines() or [""]
            lines.append(f"[{category}] {key}: {head}")
            lines.extend(f"[{category}] {key}:     {line}" for line in rest)
    return lines


def assert_same_catalog(left: Snapshot, right: Snapshot, left_name: str, right_name: str) -> None:
    if left == right:
        return
    diff = difflib.unified_diff(render(left), render(right), left_name, right_name, lineterm="", n=2)
    pytest.fail(f"catalogs of schema {SCHEMA} differ:\n" + "\n".join(diff), pytrace=False)


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def catalog_row_versions(url: str) -> list[tuple[str, str]]:
    """(object, xmin) of every relation and function in ``queen``: unchanged when nothing ran DDL."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT 'r ' || relname, xmin::text FROM pg_class WHERE relnamespace = 'queen'::regnamespace
               UNION ALL
               SELECT 'f ' || oid::regprocedure::text, xmin::text FROM pg_proc
                WHERE pronamespace = 'queen'::regnamespace
               ORDER BY 1"""
        ).fetchall()
    return [(str(a), str(b)) for a, b in rows]


async def boot_apply(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await apply_sql(conn)
    finally:
        await conn.close()


async def test_migrate_and_boot_give_the_same_catalog(pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    migrated = empty_database(pg_server)
    booted = empty_database(pg_server)

    upgrade(migrated)
    out = capsys.readouterr().out
    assert "migrate: applying 0001_baseline ..." in out
    assert f"migrate: at head {HEAD}" in out
    await boot_apply(booted)

    by_migration = catalog(migrated)
    assert "log_segments" in by_migration["relation"]
    assert by_migration["function"], "no functions in schema queen: the snapshot reads nothing?"
    assert "log_segments.log_segments_pkey" in by_migration["constraint"]
    assert_same_catalog(by_migration, catalog(booted), "alembic upgrade head", "apply_sql (boot)")

    # alembic's own table: in public, never in queen.
    assert scalar(migrated, "SELECT version_num FROM public.alembic_version") == HEAD
    assert scalar(migrated, "SELECT to_regclass('queen.alembic_version') IS NULL") is True

    # upgrade at head: nothing runs, not even a CREATE OR REPLACE.
    versions = catalog_row_versions(migrated)
    upgrade(migrated)
    out = capsys.readouterr().out
    assert "applying" not in out
    assert f"migrate: at head {HEAD}" in out
    assert catalog_row_versions(migrated) == versions
    assert_same_catalog(by_migration, catalog(migrated), "after upgrade", "after upgrade again")

    # boot on a migrated database: same catalog.
    await boot_apply(migrated)
    assert_same_catalog(by_migration, catalog(migrated), "after upgrade", "after upgrade + apply_sql")
    assert scalar(migrated, "SELECT version_num FROM public.alembic_version") == HEAD


async def test_migrate_a_database_set_up_by_boot(pg_server: PgServer) -> None:
    """A database that boot set up before alembic existed: the baseline is a no-op, and so is every later
    revision (boot already made their change): the database is stamped at head."""
    url = empty_database(pg_server)
    await boot_apply(url)
    before = catalog(url)
    upgrade(url)
    assert_same_catalog(before, catalog(url), "apply_sql (boot)", "apply_sql + alembic upgrade head")
    assert scalar(url, "SELECT version_num FROM public.alembic_version") == HEAD
    assert scalar(url, "SELECT to_regclass('queen.alembic_version') IS NULL") is True


# What a database made before revision 0002 held (the 0.1 shape): the out-of-order `acked` array, the
# view reading it, log_dlq's foreign key to log_partitions, no log_passes.
OLD_SHAPE_0001 = """
    DROP TABLE queen.log_passes;
    DROP INDEX queen.log_dlq_partition_idx;
    ALTER TABLE queen.log_consumers ADD COLUMN acked bigint[] NOT NULL DEFAULT '{}';
    ALTER TABLE queen.log_dlq ADD CONSTRAINT log_dlq_partition_id_fkey
        FOREIGN KEY (partition_id) REFERENCES queen.log_partitions (id) ON DELETE CASCADE;
"""


def old_views() -> str:
    """sql/procedures/090_views.sql as it was: v_partitions read the array (so it blocks the drop)."""
    text = (ROOT / "sql" / "procedures" / "090_views.sql").read_text()
    new = "'{}'::bigint[]                                   AS acked_ahead"
    assert new in text
    return text.replace(new, "lc.acked AS acked_ahead")


@pytest.mark.parametrize("way", ["alembic", "boot"])
async def test_a_0001_database_reaches_the_same_catalog(pg_server: PgServer, way: str) -> None:
    """A database in the shape before the offset-commit ack, brought forward by revision 0002 (then
    boot) or by boot alone (schema.sql's guarded drops), ends with the catalog of a new one."""
    fresh = empty_database(pg_server)
    await boot_apply(fresh)
    old = empty_database(pg_server)
    upgrade(old, "0001", out=lambda *_: None)
    with psycopg.connect(old, autocommit=True) as c:
        c.execute(OLD_SHAPE_0001)
        c.execute(old_views())
        assert c.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'queen.log_consumers'::regclass AND attname = 'acked'"
        ).fetchone() == (1,)
    if way == "alembic":
        upgrade(old, out=lambda *_: None)
        assert scalar(old, "SELECT version_num FROM public.alembic_version") == HEAD
    await boot_apply(old)
    assert_same_catalog(catalog(fresh), catalog(old), "apply_sql (new database)", f"0001 shape + {way}")


def run_alembic(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
        env=env,
    )


def test_alembic_command_line_upgrade_head(pg_server: PgServer) -> None:
    url = empty_database(pg_server)
    result = run_alembic("-x", f"url={url}", "upgrade", "head")
    assert result.returncode == 0, f"alembic upgrade head failed:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert scalar(url, "SELECT to_regclass('queen.log_segments') IS NOT NULL") is True
    assert scalar(url, "SELECT version_num FROM public.alembic_version") == HEAD

    result = run_alembic("-x", f"url={url}", "downgrade", "base")
    assert result.returncode == 0, f"alembic downgrade base failed:\n{result.stdout}\n{result.stderr}"
    assert scalar(url, "SELECT to_regnamespace('queen') IS NULL") is True


def test_alembic_command_line_without_url_fails_cleanly() -> None:
    result = run_alembic("upgrade", "head", env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"})
    assert result.returncode != 0
    assert "no database URL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://queen@/queen?host=%2Ftmp%2Fpg&port=5433",
            "postgresql+psycopg://queen@/queen?host=%2Ftmp%2Fpg&port=5433",
        ),
        ("postgresql://queen@/queen?host=/tmp/pg&port=5433", None),
        ("postgres://u:p@db.example:5432/x", "postgresql+psycopg://u:p@db.example:5432/x"),
        ("postgresql+asyncpg://u@h/x", "postgresql+psycopg://u@h/x"),
    ],
)
def test_sqlalchemy_url(url: str, expected: str | None) -> None:
    converted = sqlalchemy_url(url)
    assert converted.drivername == "postgresql+psycopg"
    if expected is not None:
        assert converted.render_as_string(hide_password=False) == expected
    else:
        assert converted.query == {"host": "/tmp/pg", "port": "5433"}
        assert converted.database == "queen" and converted.host is None


def test_migrate_follows_a_multi_host_url_to_the_writable_host(pg_server: PgServer) -> None:
    """The URL a broker uses to follow the primary of a replicated cluster (libpq's several hosts in the
    authority, target_session_attrs=read-write) works for ``queen-pg migrate`` too: the first host
    refuses, the second (this test's server, by its socket directory) is migrated."""
    url = empty_database(pg_server)
    parts = urlsplit(url)
    q = dict(parse_qsl(parts.query))
    refused = free_port()  # nothing listens there
    hosts = f"127.0.0.1:{refused},{quote(q.pop('host'), safe='')}:{q.pop('port')}"
    multi = urlunsplit(parts._replace(netloc=f"{parts.username}@{hosts}",
                                      query=urlencode({**q, "target_session_attrs": "read-write"})))  # fmt: skip
    upgrade(multi)
    assert scalar(url, "SELECT version_num FROM public.alembic_version") == HEAD


def test_sqlalchemy_url_rejects_other_databases() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        sqlalchemy_url("mysql://u@h/x")


OLD_TIMERS = """
    DROP INDEX queen.timers_deliver_idx;
    ALTER TABLE queen.timers ADD COLUMN fired_at timestamptz;
    CREATE INDEX timers_due_idx ON queen.timers (deliver_at) WHERE fired_at IS NULL;
    CREATE INDEX timers_fired_idx ON queen.timers (fired_at) WHERE fired_at IS NOT NULL;
    INSERT INTO queen.timers (tenant, queue, timer_key, payload, txn, txn_hash, message_id, deliver_at,
                              fired_at, created_at, updated_at)
    VALUES ('default', 'q', 'fired', '1', 't1', gen_random_uuid(), gen_random_uuid(), now(), now(), now(), now()),
           ('default', 'q', 'pending', '2', 't2', gen_random_uuid(), gen_random_uuid(), now(), NULL, now(), now());
"""


def make_old_timers(url: str) -> None:
    """The timers table as the release before 0003 left it: a fired_at column, its two indexes, one
    tombstone and one pending timer."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OLD_TIMERS)


@pytest.mark.parametrize("path", ["alembic 0001 -> head", "boot"])
async def test_timer_tombstones_go_on_either_path(pg_server: PgServer, path: str) -> None:
    """0003 (and boot's schema.sql) bring a database with timer tombstones to the shape a new one gets:
    tombstones deleted, pending timers kept, fired_at and its indexes gone."""
    fresh = empty_database(pg_server)
    await boot_apply(fresh)
    old = empty_database(pg_server)
    await boot_apply(old)
    make_old_timers(old)
    if path == "boot":
        await boot_apply(old)
    else:
        with psycopg.connect(old, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)")
            conn.execute("INSERT INTO public.alembic_version VALUES ('0001')")
        upgrade(old)
        assert scalar(old, "SELECT version_num FROM public.alembic_version") == HEAD
    assert scalar(old, "SELECT string_agg(timer_key, ',') FROM queen.timers") == "pending"
    assert_same_catalog(catalog(fresh), catalog(old), "new database", f"old database after {path}")


def test_migrate_retries_only_deadlocks() -> None:
    """`queen-pg migrate` against a database whose broker is running can be a deadlock's victim (its
    DDL re-takes table locks the broker's jobs hold); the upgrade is idempotent and runs again. Only a
    deadlock: any other error is raised at once."""
    import sqlalchemy.exc

    from queen_pg.migrate import _deadlock

    def wrapped(driver_error: Exception) -> Exception:
        try:
            try:
                raise driver_error
            except Exception as orig:
                raise sqlalchemy.exc.OperationalError("ALTER TABLE ...", {}, orig) from orig
        except Exception as outer:
            return outer

    assert _deadlock(wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))
    assert not _deadlock(wrapped(psycopg.errors.UndefinedTable("no such table")))
    assert not _deadlock(RuntimeError("not a database error"))


# What a database of the release before revision 0006 held: no head_at, its index and triggers, the
# (queue_id, consumer_group) index instead.
OLD_SHAPE_0005 = """
    DROP TRIGGER log_consumers_head_ins ON queen.log_consumers;
    DROP TRIGGER log_consumers_head_upd ON queen.log_consumers;
    DROP FUNCTION queen._cursor_head_trg();
    DROP FUNCTION queen._wake_cursors(bigint[], timestamptz[]);
    DROP FUNCTION queen._cursor_head(bigint, bigint);
    DROP INDEX queen.log_consumers_ready_idx;
    ALTER TABLE queen.log_consumers DROP COLUMN head_at;
    CREATE INDEX log_consumers_queue_group_idx ON queen.log_consumers (queue_id, consumer_group);
"""

PUSH_3 = """
    SELECT count(*) FROM queen.push_v1('default', ARRAY['q', 'q', 'q'], ARRAY['a', 'b', 'c'],
        ARRAY[queen._frame(gen_random_uuid(), 'ta', '1'), queen._frame(gen_random_uuid(), 'tb', '1'),
              queen._frame(gen_random_uuid(), 'tc', '1')],
        ARRAY[1, 2, 3], ARRAY[md5('ta')::uuid, md5('tb')::uuid, md5('tc')::uuid],
        ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], NULL, ARRAY[0, 0, 0]::smallint[])
"""
POP_1 = """
    SELECT partition_name FROM queen.pop_v1('default', 'q', NULL, NULL, %s, 'g', 1, 1, gen_random_uuid(),
                                            true, NULL, NULL)
"""


@pytest.mark.parametrize("way", ["alembic", "boot"])
async def test_a_0005_database_gets_pop_discovery_heads(pg_server: PgServer, way: str) -> None:
    """Revision 0006 on a database with cursors in every state: boot's first creation of the triggers
    fills head_at (pending ones at their head segment's time, caught-up ones NULL), the catalog is a new
    database's, and pops find what was pending, oldest first."""
    fresh = empty_database(pg_server)
    await boot_apply(fresh)
    old = empty_database(pg_server)
    await boot_apply(old)
    with psycopg.connect(old, autocommit=True) as c:
        c.execute(PUSH_3)
        assert c.execute(POP_1, ("b",)).fetchall() == [("b",)]  # b caught up; a and c pending
        c.execute(OLD_SHAPE_0005)
        c.execute("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("INSERT INTO public.alembic_version VALUES ('0005')")
    if way == "alembic":
        upgrade(old, out=lambda *_: None)
        assert scalar(old, "SELECT version_num FROM public.alembic_version") == HEAD
    await boot_apply(old)
    assert_same_catalog(catalog(fresh), catalog(old), "apply_sql (new database)", f"0005 shape + {way}")
    with psycopg.connect(old, autocommit=True) as c:
        heads = c.execute(
            """SELECT p.name, lc.head_at = s.created_at, lc.head_at IS NULL
                 FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
                 JOIN queen.log_segments s ON s.partition_id = p.id ORDER BY p.name"""
        ).fetchall()
        assert heads == [("a", True, False), ("b", None, True), ("c", True, False)]
        assert c.execute(POP_1, (None,)).fetchall() == [("a",)]
        assert c.execute(POP_1, (None,)).fetchall() == [("c",)]
        assert c.execute(POP_1, (None,)).fetchall() == []


DROPPED = ROOT / "sql" / "procedures" / "000_dropped.sql"
DROP_LINE = re.compile(r"^DROP FUNCTION IF EXISTS (queen\.\w+\([^;]*\));", re.MULTILINE)


def dropped_signatures() -> list[str]:
    """Every ``queen.name(argument types)`` that sql/procedures/000_dropped.sql drops."""
    found = [" ".join(m.split()) for m in DROP_LINE.findall(DROPPED.read_text())]
    assert len(found) > 20, "000_dropped.sql lists almost nothing: did its format change?"
    return found


async def test_boot_drops_every_gone_procedure(pg_server: PgServer) -> None:
    """A database that an earlier boot left holding superseded versions, callerless procedures and the
    earlier shapes of kept ones (a stand-in of each signature 000_dropped.sql names) ends, after a boot,
    with the catalog of a new database: every line matches its function's signature exactly."""
    fresh = empty_database(pg_server)
    await boot_apply(fresh)
    old = empty_database(pg_server)
    await boot_apply(old)
    signatures = dropped_signatures()
    with psycopg.connect(old, autocommit=True) as c:
        for signature in signatures:
            c.execute(f"CREATE FUNCTION {signature} RETURNS void LANGUAGE sql AS ''")  # type: ignore[arg-type]
        held = c.execute(
            "SELECT count(*) FROM unnest(%s::text[]) s WHERE to_regprocedure(s) IS NOT NULL", (signatures,)
        ).fetchone()
    assert held == (len(signatures),)
    await boot_apply(old)
    assert_same_catalog(catalog(fresh), catalog(old), "apply_sql (new database)", "gone procedures + boot")


async def test_segments_from_before_0012_still_pop_opened(
    pg_server: PgServer, start_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of the release before revision 0012 (its segments have no `sealed`; an encrypted
    queue's hold sealed frames) brought forward by alembic: the old segments read NULL ("may be
    sealed") and a framed pop decodes them, opening the sealed ones; new segments say what they hold."""
    url = empty_database(pg_server)
    upgrade(url, out=lambda *_: None)
    fresh = catalog(url)
    old: Any = await start_broker(url, encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=old.url) as http:
        await http.post("/api/v1/configure", json={"queue": "enc", "options": {"encryptionEnabled": True}})
        for q in ("enc", "plain"):
            r = await http.post("/api/v1/push", json={"items": [{"queue": q, "payload": [q, k]} for k in range(2)]})
            assert r.status_code == 201, r.text
    with psycopg.connect(url, autocommit=True) as c:  # the shape of 0011: no column, version 0011
        c.execute("ALTER TABLE queen.log_segments DROP COLUMN sealed")
        c.execute("UPDATE public.alembic_version SET version_num = '0011'")
    upgrade(url, out=lambda *_: None)
    assert scalar(url, "SELECT version_num FROM public.alembic_version") == HEAD
    assert scalar(url, "SELECT count(*) FROM queen.log_segments WHERE sealed IS NULL") == 2
    assert_same_catalog(fresh, catalog(url), "new database", "0011 shape + alembic")

    decoded = count_decodes(monkeypatch)
    new: Any = await start_broker(url, encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=new.url) as http:
        assert await framed_pop(http, "enc", auto_ack=True) == [["enc", 0], ["enc", 1]]
        assert await framed_pop(http, "plain", auto_ack=True) == [["plain", 0], ["plain", 1]]
        assert decoded == [2, 2]  # unknown: both decoded, as before the revision
        for q in ("enc", "plain"):
            assert (await http.post("/api/v1/push", json={"items": [{"queue": q, "payload": 9}]})).status_code == 201
        assert await framed_pop(http, "enc") == [9]
        assert await framed_pop(http, "plain") == [9]
        assert decoded == [2, 2, 1]  # the new plain segment ships as stored
    assert scalar(url, "SELECT array_agg(sealed ORDER BY partition_id, base_offset) FROM queen.log_segments") == [
        None,
        True,
        None,
        False,
    ]
