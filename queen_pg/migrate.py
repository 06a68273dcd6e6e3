"""Schema migrations with alembic (``migrations/``), run programmatically: backs ``queen-pg migrate``.

Two paths bring a database to the current schema and must give the same catalog
(tests/test_migrations.py):

* boot: ``queen_pg.db.apply.apply_sql`` applies ``sql/`` idempotently at every start;
* migrate: ``alembic upgrade head`` (this module, or the ``alembic`` command line with
  ``alembic.ini`` at the repository root). Every revision upgrades by :func:`apply_sql`, ``sql/`` as
  it is: ``sql/schema.sql`` brings tables of any older shape forward (guarded, idempotent), so a
  change is written once, there; a revision file holds its downgrade (the policy is in
  ``migrations/versions/0001_baseline.py``).

Alembic keeps its ``alembic_version`` table in schema ``public``, outside ``queen``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from alembic import command, op
from alembic.config import Config
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import Script, ScriptDirectory
from sqlalchemy import URL, create_engine, make_url, pool

from queen_pg.db.apply import sql_files
from queen_pg.resources import data_dir

Printer = Callable[[str], None]

_POSTGRES_SCHEMES = ("postgresql", "postgres")

# Alembic's version table, always schema-qualified: with the default search_path ("$user", public)
# and a role named like the schema (the embedded server's role is `queen`), an unqualified
# alembic_version would land in `queen` whenever that schema already exists, e.g. on a database
# that boot set up before alembic was first run.
VERSION_TABLE_SCHEMA = "public"


def migrations_dir() -> Path:
    """The ``migrations/`` directory: ``queen_pg/migrations`` in a wheel, the repository's in a checkout."""
    return data_dir("migrations", "env.py")


def _hosts_in_query(url: str) -> str:
    """libpq's multi-host URL (``postgresql://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write``,
    how a broker follows the primary of a replicated cluster) in the equivalent form SQLAlchemy can
    parse (``postgresql://u:p@/db?host=h1,h2&port=5432,5432&...``), which psycopg hands to libpq as it
    is. Any other URL comes back unchanged."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return url
    hosts: list[str] = []
    ports: list[str] = []
    for item in hostlist.split(","):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        hosts.append(unquote(host))  # a socket directory is percent-encoded there
        ports.append(port)
    query = [("host", ",".join(hosts))]
    if any(ports):
        query.append(("port", ",".join(p or "5432" for p in ports)))
    query += parse_qsl(parts.query, keep_blank_values=True)
    return urlunsplit(parts._replace(netloc=userinfo + at, query=urlencode(query)))


def sqlalchemy_url(url: str) -> URL:
    """A ``postgresql://`` URL (any form libpq takes as a URL, e.g. ``postgresql://user@/db?host=
    /socket/dir&port=N``, or several hosts: ``postgresql://u@h1:5432,h2:5432/db``) as the SQLAlchemy URL
    of the psycopg 3 driver."""
    parsed = make_url(_hosts_in_query(url))
    if parsed.drivername.split("+", 1)[0] not in _POSTGRES_SCHEMES:
        raise ValueError(f"not a PostgreSQL URL: {parsed.render_as_string(hide_password=True)}")
    return parsed.set(drivername="postgresql+psycopg")


def display_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable url>"


def alembic_config(url: str | None = None) -> Config:
    """The alembic Config of this project: ``alembic.ini`` beside ``migrations/`` when present (a
    checkout), else one built with only the script location (a wheel carries no alembic.ini). The URL
    travels in ``attributes`` (not in the ini options, which would interpolate ``%``); the
    application's logging is left alone."""
    mdir = migrations_dir()
    ini = mdir.parent / "alembic.ini"
    cfg = Config(str(ini)) if ini.is_file() else Config()
    cfg.set_main_option("script_location", str(mdir).replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    if url is not None:
        cfg.attributes["database_url"] = url
    return cfg


def revision_name(script: Script) -> str:
    """``0001_baseline``: the revision's file name without ``.py``."""
    return Path(script.path).stem


def execute_sql(sql: str) -> None:
    """Execute SQL text inside a running migration through the raw psycopg connection: no bind
    parameters, so ``%`` and ``:`` in the text are literal, and several statements may be sent at
    once (simple query protocol), exactly as boot sends a file of ``sql/``."""
    dbapi = op.get_bind().connection.dbapi_connection
    if dbapi is None:  # pragma: no cover - the connection is checked out for the whole migration
        raise RuntimeError("no DBAPI connection in the migration context")
    cursor = dbapi.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


# The migration runs (one per `alembic upgrade`) that have applied sql/ already: the later revisions of
# the run find nothing left to do.
_APPLIED: weakref.WeakSet[MigrationContext] = weakref.WeakSet()


def apply_sql() -> None:
    """The upgrade of every revision: ``sql/`` as it is (``schema.sql``, then ``procedures/*.sql`` in
    lexical order), the files and order boot applies, once per migration run. ``schema.sql`` carries
    each table change as a guarded, idempotent statement (boot runs it on databases of every age), so
    one text brings any revision's database to this checkout's tables and procedures."""
    ctx = op.get_context()
    if ctx in _APPLIED:
        return
    for path in sql_files():
        execute_sql(path.read_text())
    _APPLIED.add(ctx)


def revision_steps(down: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """A revision's ``upgrade, downgrade``: the upgrade is :func:`apply_sql` (every revision's); the
    downgrade runs ``down``, the SQL that gives the previous release its tables back."""

    def downgrade() -> None:
        execute_sql(down)

    return apply_sql, downgrade


def current_heads(url: str) -> tuple[str, ...]:
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return tuple(
                MigrationContext.configure(
                    connection, opts={"version_table_schema": VERSION_TABLE_SCHEMA}
                ).get_current_heads()
            )
    finally:
        engine.dispose()


def pending_revisions(script_dir: ScriptDirectory, current: Iterable[str], target: str) -> list[Script]:
    """The revisions an upgrade from ``current`` to ``target`` applies, oldest first."""
    lower: tuple[str, ...] | str | None = tuple(current) or None
    scripts = list(script_dir.iterate_revisions(target, lower))
    scripts.reverse()
    return scripts


class _Progress:
    """Prints a line before and after each revision (``on_version_apply`` runs after one)."""

    def __init__(self, pending: list[Script], out: Printer) -> None:
        self.pending = pending
        self.out = out
        self.index = 0
        self.started = time.monotonic()

    def begin(self) -> None:
        if self.pending:
            self.out(f"migrate: applying {revision_name(self.pending[0])} ...")
        self.started = time.monotonic()

    def __call__(self, *, ctx: MigrationContext, step: MigrationInfo, heads: set[str], run_args: Any) -> None:
        script = step.up_revision
        name = revision_name(script) if isinstance(script, Script) else str(step.up_revision_id)
        self.out(f"migrate: applied {name} in {(time.monotonic() - self.started) * 1000:.0f} ms")
        self.index += 1
        if self.index < len(self.pending):
            self.out(f"migrate: applying {revision_name(self.pending[self.index])} ...")
        self.started = time.monotonic()


DEADLOCK_ATTEMPTS = 5


def _deadlock(exc: BaseException) -> bool:
    """A PostgreSQL deadlock (SQLSTATE 40P01), however wrapped (SQLAlchemy, psycopg)."""
    seen: BaseException | None = exc
    while seen is not None:
        if (
            getattr(seen, "sqlstate", None) == "40P01"
            or getattr(getattr(seen, "orig", None), "sqlstate", None) == "40P01"
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def upgrade(url: str, revision: str = "head", out: Printer = print) -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: the newest), printing progress."""
    cfg = alembic_config(url)
    script_dir = ScriptDirectory.from_config(cfg)
    before = current_heads(url)
    out(f"migrate: {display_url(url)} at {', '.join(before) or 'an empty version table (base)'}")
    try:
        pending = pending_revisions(script_dir, before, revision)
    except Exception:  # an unusual target (relative, branch): alembic reports what it does
        pending = []
    progress = _Progress(pending, out)
    cfg.attributes["on_version_apply"] = progress
    progress.begin()
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            command.upgrade(cfg, revision)
            break
        except Exception as exc:
            # a live broker's jobs lock the tables the DDL re-takes (ALTER ... IF NOT EXISTS still locks):
            # PostgreSQL may pick this transaction as the deadlock's victim. It rolled back whole and is
            # idempotent: run it again.
            if attempt == DEADLOCK_ATTEMPTS or not _deadlock(exc):
                raise
            out(f"migrate: deadlock with a running broker (attempt {attempt}); retrying")
    after = current_heads(url)
    heads = set(script_dir.get_heads())
    where = "at head" if after and set(after) == heads else "at"
    out(f"migrate: {where} {', '.join(after) or 'base'}")
