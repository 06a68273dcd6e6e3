"""The pool's release: one statement per call, no reset query behind it (queen_pg/db/pool.py)."""

from __future__ import annotations

import asyncio

import asyncpg

from queen_pg.db.pool import Database


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
