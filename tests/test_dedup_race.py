"""Exact dedup under concurrency (docs/architecture.md#hot-paths): two pushes of one transactionId to one
partition never both store it. No index of log_txns says "unique" (its key holds the offset, and a
transactionId may name several messages after its window); the verdict is decided under the partition
row lock that every writer of log_txns holds, so the second push waits for the first and then reads
its hash. Deterministic: the first push is held open in a transaction while the second is seen
waiting on a lock, for each of push_v3's paths (one item, several items, several groups)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from queen_pg.engine import calls
from queen_pg.engine.codec import txn_hash
from queen_pg.engine.push import NewMessage, prepare
from tests.helpers import until

SHAPES = {
    "one item": [("q", "p")],
    "several items": [("q", "p"), ("q", "p"), ("q", "p")],
    "several groups": [("q", "p"), ("q", "other")],
}


def items(shape: list[tuple[str, str]], tag: str) -> list[NewMessage]:
    """The first item carries the contested transactionId, the others ids of their own."""
    return [NewMessage(q, p, b"1", "contested" if i == 0 else f"{tag}-{i}", None) for i, (q, p) in enumerate(shape)]


async def push_v3(conn: asyncpg.Connection, batch: list[NewMessage]) -> asyncpg.Record:
    prepared = prepare(batch)
    row = await conn.fetchrow(calls.PUSH, "default", *prepared.args_v3(), prepared.sealed)
    assert row is not None
    return row


async def waiting_on_a_lock(probe: asyncpg.Connection, pid: int) -> bool:
    return bool(await probe.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("first_commits", [True, False])
async def test_two_pushes_of_one_transaction_id_store_it_once(
    db_url: str, conn: asyncpg.Connection, shape: str, first_commits: bool
) -> None:
    await push_v3(conn, items(SHAPES[shape], "setup"))  # the partitions exist: push_v3's own paths
    await conn.execute("DELETE FROM queen.log_txns WHERE txn_hash = $1", txn_hash("contested"))
    a = await asyncpg.connect(db_url)
    b = await asyncpg.connect(db_url)
    try:
        tx = a.transaction()
        await tx.start()
        first = await push_v3(a, items(SHAPES[shape], "a"))
        assert list(first["dup_idx"]) == []
        second = asyncio.create_task(push_v3(b, items(SHAPES[shape], "b")))
        b_pid = b.get_server_pid()
        await until(lambda: waiting_on_a_lock(conn, b_pid), "the second push waiting on the partition lock")
        if first_commits:
            await tx.commit()
        else:
            await tx.rollback()
        got = await asyncio.wait_for(second, 30)
    finally:
        await a.close()
        await b.close()
    # the first item is the contested one: a duplicate of the first push exactly when that committed
    assert list(got["dup_idx"]) == ([1] if first_commits else [])
    rows = await conn.fetch(
        "SELECT partition_id, msg_offset FROM queen.log_txns WHERE txn_hash = $1", txn_hash("contested")
    )
    assert len(rows) == 1
    if first_commits:
        assert got["dup_offset"][0] == rows[0]["msg_offset"] == first["base_offsets"][0]
