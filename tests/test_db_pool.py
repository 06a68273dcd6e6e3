"""The pool's release: one statement per call, no reset query behind it; the hot connection
(queen_pg/db/pool.py)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from queen_pg.db.pool import Database
from queen_pg.errors import QueenError
from tests.helpers import eventually, until


async def _last_queries(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(
        "SELECT query FROM pg_stat_activity WHERE application_name = 'queen-pg' AND datname = current_database()"
    )
    return [r["query"] for r in rows]


async def test_a_released_connection_runs_no_reset_query(db: Database, conn: asyncpg.Connection) -> None:
    # asyncpg's default release runs `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`:
    # one more round trip per call. The last statement each pooled backend ran is the call itself.
    assert await db.fetchval("SELECT 'only-statement'") == "only-statement"
    queries = await _last_queries(conn)
    assert queries == ["SELECT 'only-statement'"]
    assert not any("RESET ALL" in q for q in queries)


async def test_a_transaction_left_open_is_still_rolled_back_on_release(db: Database, conn: asyncpg.Connection) -> None:
    # the driver's own part of the reset stays: a call cancelled inside an explicit transaction does not
    # hand the next caller a connection in that transaction
    await conn.execute("CREATE TABLE t (x int)")
    async with db.pool.acquire() as c:
        tx = c.transaction()
        await tx.start()
        await c.execute("INSERT INTO t VALUES (1)")
    rows = await asyncio.gather(*(db.fetch("SELECT count(*) AS n, now() = statement_timestamp() AS fresh FROM t")
                                  for _ in range(3)))  # fmt: skip
    assert all(r[0]["n"] == 0 for r in rows)  # the insert was rolled back, not committed by a later call
    assert await conn.fetchval("SELECT count(*) FROM t") == 0


# --- the hot connection: a lone call skips the pool's acquire and release -----------------------------


async def _pid(db: Database) -> int:
    return int(await db.fetchval("SELECT pg_backend_pid()"))


async def test_calls_one_at_a_time_stay_on_one_connection_kept_out_of_the_pool(db: Database) -> None:
    first = await _pid(db)
    assert [await _pid(db) for _ in range(5)] == [first] * 5
    # between calls the hot connection stays checked out: no acquire or release per call
    assert db.pool.get_size() == 1 and db.pool.get_idle_size() == 0
    assert db.idle_size() == 1  # ... and is reported idle (metrics, /system): no call is on it


async def test_concurrent_calls_take_pooled_connections_beside_the_hot_one(
    db: Database, conn: asyncpg.Connection
) -> None:
    await _pid(db)  # the hot connection exists
    await conn.execute("SELECT pg_advisory_lock($1)", GATE)
    calls = asyncio.gather(*(db.fetchval(f"SELECT pg_backend_pid() FROM {GATED_SHARED}") for _ in range(4)))
    await until(lambda: _waiting(conn, 4), "four calls waiting at the gate at once")
    await conn.execute("SELECT pg_advisory_unlock($1)", GATE)
    pids = await calls
    assert len(set(pids)) == 4  # one each: none waited for another's connection
    assert db.pool.get_size() == 4  # the pool's size still counts (and bounds) the hot one


async def test_an_error_raised_by_postgresql_keeps_the_hot_connection(db: Database) -> None:
    before = await _pid(db)
    with pytest.raises(QueenError):
        await db.fetch("SELECT 1 / 0")  # not a catalog refusal: an internal error, the statement rolled back
    assert await _pid(db) == before


async def test_a_cancelled_call_hands_the_hot_connection_back_and_the_next_call_is_clean(
    db: Database, conn: asyncpg.Connection
) -> None:
    await conn.execute("CREATE TABLE t (x int)")
    await conn.execute("SELECT pg_advisory_lock($1)", GATE)
    task = asyncio.create_task(db.fetch(f"INSERT INTO t SELECT 1 FROM {GATED}"))
    await until(lambda: _waiting(conn, 1), "the insert waiting at the gate")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await conn.execute("SELECT pg_advisory_unlock($1)", GATE)
    # the pool's release waited out the cancellation: the next call answers, and the insert never happened
    assert await db.fetchval("SELECT count(*) FROM t") == 0
    assert await db.fetchval("SELECT 'after'") == "after"


async def test_a_backend_killed_under_the_hot_connection_costs_one_call_at_most(
    db: Database, conn: asyncpg.Connection
) -> None:
    victim = await _pid(db)
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", victim)
    outcomes: list[str] = []
    for _ in range(2):
        try:
            pid = await _pid(db)
            outcomes.append("ok" if pid != victim else "same")
        except QueenError as exc:
            outcomes.append(exc.code)
    assert outcomes in (["db_unavailable", "ok"], ["ok", "ok"])  # never the dead one again, never a 500


async def test_a_backend_that_ended_while_the_hot_connection_was_idle_costs_no_call(
    db: Database, conn: asyncpg.Connection
) -> None:
    # review5: the pool's acquire checks a connection it hands out; the hot connection skips the
    # acquire, so it must check itself. Its backend killed between two calls (a restart,
    # idle_session_timeout, an operator) and seen lost by the driver: the next call runs on a fresh
    # connection instead of answering 503 (an ack refused for nothing, its lease left to expire).
    victim = await _pid(db)
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", victim)
    await eventually(db._hot_gone, "the driver sees the hot connection lost")
    assert await _pid(db) != victim
    assert await _pid(db) == await _pid(db)  # and the new one is hot in turn


async def test_close_waits_for_a_call_on_the_hot_connection(db_url: str, conn: asyncpg.Connection) -> None:
    d = Database(db_url, 2)
    await d.open(apply_schema=False)
    await conn.execute("SELECT pg_advisory_lock($1)", GATE)
    call = asyncio.create_task(d.fetchval(f"SELECT 'done' FROM {GATED_SHARED}"))
    await until(lambda: _waiting(conn, 1), "the call on the hot connection waiting at the gate")
    closing = asyncio.create_task(d.close())
    await conn.execute("SELECT pg_advisory_unlock($1)", GATE)  # a yield: close is under way meanwhile
    await asyncio.wait_for(closing, 10)  # the call gives the connection back: close does not hang
    assert call.done() and call.result() == "done"


# Calls are held in flight by an advisory lock the test's own connection holds (the gate), and let go
# when it unlocks: no statement sleeps for a guessed time.
GATE = 7_140_001
GATED = "(SELECT pg_advisory_xact_lock(7140001)) AS gate"
GATED_SHARED = "(SELECT pg_advisory_xact_lock_shared(7140001)) AS gate"


async def _waiting(conn: asyncpg.Connection, n: int) -> bool:
    """Exactly ``n`` sessions wait for the gate."""
    got = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = $1 AND NOT granted",
        GATE,
    )
    return bool(got == n)
