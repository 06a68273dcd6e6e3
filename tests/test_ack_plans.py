"""The ack's generic plans go through the keys even when the tables were ANALYZEd small.

The method of tests/test_push_plans.py for queen.ack_v3 (its fast path and queen._ack_settle's look-up),
queen.ack_v1 (item by item: a nack) and queen.transaction_v1: each runs with ``plan_cache_mode =
force_generic_plan``, so a connection plans their statements once and keeps the plan; one made while
log_txns, log_consumers or log_segments held a few rows could read them whole per item for as long as
the connection lives. The tables are ANALYZEd nearly empty, the plans made, the tables grown, then every
plan is read back through auto_explain: no sequential scan of a keyed table.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest

from queen_pg.engine import calls, codec
from queen_pg.engine import push as push_engine
from queen_pg.engine.ack_pack import Packed
from queen_pg.engine.leases import LeaseBook
from tests.test_pop_discovery import Plans

ACK_FNS = [
    "queen.ack_v3",
    "queen._ack_settle",
    "queen._ack_commit",
    "queen.ack_v1",
    "queen._ack_wakes",
    "queen.transaction_v1",
    "queen._pass_over",
    "queen._cursor_head",
]
KEYED = {"log_txns", "log_partitions", "log_consumers", "log_segments", "queues", "log_passes", "log_leases"}


async def _push(conn: asyncpg.Connection, queue: str, partition: str, n: int, tag: str) -> None:
    msgs = [push_engine.NewMessage(queue, partition, b'{"n":1}', f"{tag}-{i}", None) for i in range(n)]
    p = push_engine.prepare(msgs)
    await conn.fetch(calls.PUSH, "default", *p.args_v3(), p.sealed)


async def _lease(conn: asyncpg.Connection, queue: str, batch: int) -> tuple[uuid.UUID, list[Any]]:
    lease = uuid.uuid4()
    rows = await conn.fetch(
        calls.POP, "default", queue, None, None, None, "g", batch, 1, lease, False, "all", None, None
    )
    assert rows
    return lease, rows


def _txns(rows: list[Any]) -> list[tuple[int, str]]:
    """(partition id, transactionId) of every leased message, in offset order (one partition)."""
    out: list[tuple[int, str]] = []
    for row in rows:
        for off, f in enumerate(codec.unpack(bytes(row["payload"]), row["codec"]), start=row["base_offset"]):
            if row["lease_start"] <= off < row["lease_end"]:
                out.append((row["partition_id"], f.transaction_id))
    return out


async def _ack(conn: asyncpg.Connection, lease: uuid.UUID, rows: list[Any], status: str, hinted: bool) -> Any:
    book = LeaseBook()
    book.remember(lease, rows)
    pack = Packed()
    for pid, txn in _txns(rows):
        pack.add(pid, txn, lease, "g", status, None)
    return await conn.fetchrow(calls.ACK, "default", *pack.args(), pack.hint(book) if hinted else None)


async def _ack_fused(conn: asyncpg.Connection, leased: list[tuple[uuid.UUID, list[Any]]]) -> Any:
    """Several leases acked in one hinted call (fused requests: ack_v3's several-kinds fast path)."""
    book = LeaseBook()
    pack = Packed()
    for lease, rows in leased:
        book.remember(lease, rows)
        for pid, txn in _txns(rows):
            pack.add(pid, txn, lease, "g", "completed", None)
    hint = pack.hint(book)
    assert hint is not None and None not in hint
    return await conn.fetchrow(calls.ACK, "default", *pack.args(), hint)


@pytest.mark.parametrize("fn", ACK_FNS)
async def test_the_ack_functions_never_plan_a_sequential_scan(conn: asyncpg.Connection, fn: str) -> None:
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = $1::regproc", fn)
    assert config is not None and "enable_seqscan=off" in config


async def test_ack_plans_made_on_small_statistics_read_by_key(conn: asyncpg.Connection) -> None:
    """Statistics and plans taken on nearly empty tables, then 40 partitions of 150 messages: the
    hinted fast path, the look-up path, a nack judged item by item (ack_v1) and a transaction's ack
    read every table through an index, and settle what they should."""
    await _push(conn, "q", "p0", 2, "seed")
    await conn.execute("ANALYZE queen.log_txns; ANALYZE queen.log_partitions; ANALYZE queen.queues")
    await conn.execute("ANALYZE queen.log_consumers; ANALYZE queen.log_segments; ANALYZE queen.log_leases")
    # the plans are made now, on the small statistics (each function's first call on this connection)
    lease, rows = await _lease(conn, "q", 1)
    assert list((await _ack(conn, lease, rows, "completed", True))["o_released"]) == [1]
    lease, rows = await _lease(conn, "q", 1)
    assert list((await _ack(conn, lease, rows, "completed", False))["o_released"]) == [1]
    await _push(conn, "q", "p1", 1, "seed1")
    await _push(conn, "q", "p2", 1, "seed2")
    assert list((await _ack_fused(conn, [await _lease(conn, "q", 1), await _lease(conn, "q", 1)]))["o_released"]) == [
        1,
        2,
    ]
    pack = Packed()
    pack.add(rows[0]["partition_id"], "nobody", None, "g", "retry", None)
    await conn.fetch(calls.ACK_ROWS, "default", *pack.arrays())
    for p in range(40):  # then the tables grow
        await _push(conn, "q", f"p{p}", 150, f"grow{p}")
    leased = [await _lease(conn, "q", 100) for _ in range(6)]  # six partitions' 100 each
    async with Plans(conn) as plans:
        hinted = await _ack(conn, *leased[0], "completed", True)
        looked = await _ack(conn, *leased[1], "completed", False)
        lease, rows = leased[2]
        pid, first = _txns(rows)[0]
        pack = Packed()
        pack.add(pid, first, lease, "g", "failed", "boom")
        nack = await conn.fetch(calls.ACK_ROWS, "default", *pack.arrays())
        lease, rows = leased[3]
        pid, first = _txns(rows)[0]
        tx = await conn.fetchval(
            calls.TRANSACTION, "default", [pid], [codec.txn_hash(first)], [first], [lease], ["g"], ["completed"],
            [0], [], [], [], [], [], [], [], [], [], "[]", 1, "[]", [], [], [], 1, None, None,
        )  # fmt: skip
        fused = await _ack_fused(conn, leased[4:6])
    assert list(hinted["o_released"]) == [100] and list(hinted["o_wake"]) == ["q"]
    assert list(looked["o_released"]) == [100] and list(looked["o_wake"]) == ["q"]
    assert nack[0]["success"] and nack[0]["lease_released"]
    assert json.loads(tx)["wake"] == []  # one of 100 acked: the lease is still held
    assert list(fused["o_released"]) == [100, 200] and list(fused["o_wake"]) == ["q"]
    scans: list[tuple[str, str]] = []
    for kind, rel, _node, doc in plans.scans(KEYED):
        scans.append((kind, rel))
        assert kind != "Seq Scan", f"{rel} scanned whole: {doc['Query Text'][:300]}"
    assert any(rel == "log_txns" for _, rel in scans), scans
