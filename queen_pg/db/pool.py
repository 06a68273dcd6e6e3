"""The connection pool and the one way the engine calls PostgreSQL.

``Database.call`` runs one statement (a stored-procedure call) on a pooled connection and maps
driver errors to the error catalog. asyncpg caches the prepared statement per connection, and a
released connection skips the driver's reset query (``_keep_session``), so a steady-state call is one
round trip.

The hot connection: one pooled connection stays checked out and serves every call that finds it free,
so a call at low concurrency skips the pool's acquire and release (a timeout, a shielded release task,
a reset and an inactivity timer each: about a quarter of the broker's work for a lone 1-item push).
Calls that find it busy take a pooled connection as before, so it only ever replaces the pool for
one call at a time and the pool's size still bounds the connections. It runs single statements only
(never an explicit transaction); a call on it that ends in anything but an answer or an error raised
by PostgreSQL (a cancellation, a lost connection) hands it back to the pool's release, which waits
out a cancellation and rolls back or terminates it, and the next call checks out another. A hot
connection found lost before a call (its backend ended while idle) is given back the same way first,
so that call runs on a fresh one (as the pool's acquire checks), not into a 503.

Following the primary (a failover, a switchover): a session that answers it cannot write (SQLSTATE
25006, a standby or a primary being demoted) or that is being shut down (57P) or broken (08) is
dropped, never pooled again, so the next call connects afresh: through a proxy that routes to the
primary, or to the writable host of a multi-host ``DATABASE_URL`` with ``target_session_attrs=
read-write``. The call that met it is a 503 ``db_unavailable`` (with ``Retry-After``), never a 500.
The pool's other sessions went to the same server, so they are expired too (each is replaced when next
taken; the hot connection is handed back before its next call): a session that served only reads on a
standby is not kept for the first write after the failover.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson
from asyncpg import Record

from queen_pg.db.apply import apply_sql
from queen_pg.errors import CATALOG, DB_UNAVAILABLE, RETRY, QueenError, Verdict, internal

log = logging.getLogger("queen_pg.db")

__all__ = ["Database", "Record"]


# SQLSTATE classes that mean "the database is not there for us right now", with what the 503 says (the
# driver's own text goes to the log, never into an answer): connection exceptions, operator
# intervention (shutdown, start-up), insufficient resources, invalid catalog (database dropped),
# authorization, and a read-only session (a hot standby, or a primary demoted under the broker).
_UNAVAILABLE_SQLSTATES = {
    "08": "the connection to PostgreSQL failed",
    "25006": "PostgreSQL is read-only (a standby, or a primary being demoted)",
    "57P": "PostgreSQL is shutting down or starting up",
    "53": "PostgreSQL is out of resources (connections, memory or disk)",
    "3D000": "the database does not exist",
    "28": "PostgreSQL refused the broker's credentials",
}
# Connection-state errors raised by the driver itself (not by the server): a connection closed under
# a call, a pool whose connections died with a PostgreSQL restart (InternalClientError right after it
# comes back), a refused or timed-out connect, a pool acquire that timed out.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
# A session that answered one of these can serve no more calls: dropped (terminated), never pooled again.
_DROP_SQLSTATES = ("08", "57P", "25006")
ACQUIRE_TIMEOUT_S = 30.0  # a call that waits longer than this for a pooled connection is a 503

VERDICT_SQLSTATE = "QN000"  # raised by queen._verdict(): a decided refusal, rolled back, answered 200
LOCK_NOT_AVAILABLE = "55P03"  # a NOWAIT row lock was busy: the `reserved` verdict (try again)
REFUSAL_SQLSTATE = "QN001"  # raised by queen._refuse(code, detail): an error of the catalog, by its code


def _verdict(exc: asyncpg.PostgresError) -> Verdict:
    try:
        detail = orjson.loads(getattr(exc, "detail", None) or "{}")
    except orjson.JSONDecodeError:
        detail = {"detail": getattr(exc, "detail", None)}
    return Verdict(str(getattr(exc, "message", "")) or "rejected", detail if isinstance(detail, dict) else {})


def _unavailable(exc: BaseException) -> str | None:
    """What a 503 says for a connection-state error; None when ``exc`` is not one."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    for prefix, why in _UNAVAILABLE_SQLSTATES.items():
        if sqlstate.startswith(prefix):
            return why
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        return "no host of DATABASE_URL is a writable primary (target_session_attrs)"
    if isinstance(exc, TimeoutError):
        return "timed out waiting for PostgreSQL"
    if isinstance(exc, CONNECTION_ERRORS):
        return "no connection to PostgreSQL"
    return None


def _drops_session(exc: BaseException) -> bool:
    """Whether the session that raised ``exc`` must be dropped rather than serve another call."""
    return (getattr(exc, "sqlstate", None) or "").startswith(_DROP_SQLSTATES)


def _terminate(conn: Any) -> None:
    """Close a pooled session at once (the pool's release then replaces it instead of reusing it)."""
    with contextlib.suppress(Exception):
        conn.terminate()


def _map_error(exc: BaseException) -> QueenError:
    """Driver errors to catalog codes; constraint names decide where it matters. Anything unexpected
    is a 500 whose answer carries only a request id (the cause is logged under that id)."""
    why = _unavailable(exc)
    if why is not None:
        return QueenError(DB_UNAVAILABLE, detail=why)
    if isinstance(exc, asyncpg.ForeignKeyViolationError | asyncpg.SerializationError | asyncpg.DeadlockDetectedError):
        return QueenError(RETRY, detail=f"concurrent change ({exc.__class__.__name__})")
    if isinstance(exc, asyncpg.UniqueViolationError):
        return QueenError(RETRY, detail=f"concurrent create ({getattr(exc, 'constraint_name', '')})")
    return internal(log, exc)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a released connection runs instead of asyncpg's default reset query (``SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): nothing. That query is one more
    round trip per call (broker and PostgreSQL CPU, and the caller waits for it before its answer),
    undoing session state this package never creates: a call is one statement, procedures take only
    transaction-level advisory locks, nothing LISTENs, SETs or keeps a cursor on a pooled connection.
    The driver still rolls back a transaction left open (a cancelled call) before this runs."""


class Database:
    """An asyncpg pool plus the calls the engine makes."""

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn = dsn
        self.size = size
        self._pool: asyncpg.Pool | None = None
        self._hot: asyncpg.pool.PoolConnectionProxy | None = None  # checked out, free when not _hot_busy
        self._hot_busy = False  # a call is on the hot connection (or checking it out)
        self._epoch = 0  # bumped when the pool's sessions are expired (a read-only or shutting-down answer)
        self._hot_epoch = 0  # the epoch the hot connection was checked out in
        self._closing = False

    async def open(self, apply_schema: bool) -> None:
        if apply_schema:
            conn = await asyncpg.connect(self.dsn)
            try:
                await apply_sql(conn)
            finally:
                await conn.close()
        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=1,
            max_size=self.size,
            command_timeout=60,
            server_settings={"application_name": "queen-pg"},
            reset=_keep_session,
        )

    async def close(self) -> None:
        self._closing = True
        if self._hot is not None and not self._hot_busy:
            await self._give_back_hot()
        if self._pool is not None:
            await self._pool.close()  # waits for a call still on the hot connection: it gives it back
            self._pool = None

    async def _give_back_hot(self) -> None:
        conn, self._hot = self._hot, None
        if conn is not None and self._pool is not None:
            with contextlib.suppress(Exception):
                await self._pool.release(conn)

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise QueenError(DB_UNAVAILABLE, detail="pool is not open")
        return self._pool

    def idle_size(self) -> int:
        """Connections serving no call: the pool's idle ones, plus the hot connection while no call is
        on it (it stays checked out of the pool, so the pool counts it as in use)."""
        return int(self.pool.get_idle_size()) + (1 if self._hot is not None and not self._hot_busy else 0)

    async def fetch(self, sql: str, *args: Any) -> list[Record]:
        try:
            if self._hot_busy or self._closing:
                async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                    try:
                        rows: list[Record] = await conn.fetch(sql, *args)
                    except asyncpg.PostgresError as exc:
                        if _drops_session(exc):
                            _terminate(conn)
                            await self._expire()
                        raise
                    return rows
            return await self._fetch_hot(sql, args)
        except QueenError:
            raise
        except asyncpg.PostgresError as exc:
            sqlstate = getattr(exc, "sqlstate", None)
            if sqlstate == VERDICT_SQLSTATE:
                raise _verdict(exc) from None
            if sqlstate == REFUSAL_SQLSTATE:
                kind = CATALOG.get(str(getattr(exc, "message", "")))
                if kind is None:  # a code the catalog does not know: a bug, not the caller's fault
                    raise internal(log, exc, sql=sql.split("(", 1)[0]) from exc
                raise QueenError(kind, detail=getattr(exc, "detail", None) or str(exc)) from None
            if sqlstate == LOCK_NOT_AVAILABLE:
                raise Verdict("reserved", {"error": "another write holds that cursor right now; try again"}) from None
            raise self._mapped(exc) from exc
        except CONNECTION_ERRORS as exc:
            raise self._mapped(exc) from exc

    async def _fetch_hot(self, sql: str, args: tuple[Any, ...]) -> list[Record]:
        """One statement on the hot connection (checked out of the pool first if there is none)."""
        self._hot_busy = True
        healthy = False
        try:
            if self._hot is not None and (self._hot_gone() or self._hot_epoch != self._epoch):
                # its backend ended while no call was on it (killed, a restart, idle_session_timeout):
                # asyncpg already took it back (or it is closed), as the pool's acquire would check; or
                # the pool's sessions were expired (the release closes it)
                await self._give_back_hot()
            if self._hot is None:
                self._hot_epoch = self._epoch
                self._hot = await self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S)
            try:
                rows: list[Record] = await self._hot.fetch(sql, *args)
            except asyncpg.PostgresError as exc:
                if _drops_session(exc):  # read-only, shutting down, broken: this session serves no more calls
                    _terminate(self._hot)
                    await self._expire()
                    raise
                healthy = True  # PostgreSQL answered (an error): the statement is over and rolled back,
                # or it ended the session (is_closed below)
                raise
            healthy = True
            return rows
        finally:
            self._hot_busy = False
            if not healthy or self._closing or self._hot_gone():
                await self._give_back_hot()  # the pool's release waits, rolls back or terminates

    async def _expire(self) -> None:
        """Replace every session of the pool when it is next taken (they all went to the server that just
        answered read-only or shutting down)."""
        self._epoch += 1
        if self._pool is not None:
            await self._pool.expire_connections()

    def _hot_gone(self) -> bool:
        """Whether the hot connection can serve no more calls: closed, or already taken back by the pool
        (asyncpg detaches a proxy whose connection was lost; asking it anything then raises)."""
        conn = self._hot
        if conn is None:
            return False
        try:
            return bool(conn.is_closed())
        except asyncpg.InterfaceError:
            return True

    @staticmethod
    def _mapped(exc: BaseException) -> QueenError:
        err = _map_error(exc)
        if err.code != "internal":  # an internal error has logged itself, with its request id
            log.warning("event=db_error code=%s error=%s", err.code, f"{exc.__class__.__name__}: {exc}")
        return err

    async def fetchval(self, sql: str, *args: Any) -> Any:
        rows = await self.fetch(sql, *args)
        return rows[0][0] if rows else None

    async def ping(self, within: float = 2.0) -> bool:
        return await self.state(within) == "up"

    async def state(self, within: float = 2.0) -> str:
        """``up`` (answers and can write), ``read-only`` (answers, refuses writes: a standby, or a primary
        being demoted; that session is dropped) or ``down``."""
        try:
            async with self.pool.acquire(timeout=within) as conn:
                if await conn.fetchval("SELECT current_setting('transaction_read_only')", timeout=within) == "off":
                    return "up"
                _terminate(conn)
                await self._expire()
                return "read-only"
        except (asyncpg.PostgresError, QueenError, *CONNECTION_ERRORS):
            return "down"

    @staticmethod
    def rows_to_dicts(rows: Sequence[Record]) -> list[dict[str, Any]]:
        return [dict(r) for r in rows]
