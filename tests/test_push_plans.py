"""The push's generic plans go through the keys even when the tables were ANALYZEd small.

push_v3 and _push_core run with ``plan_cache_mode = force_generic_plan``: each connection plans their
statements once and keeps the plan. Autovacuum analyzes log_txns first when it holds a few rows; a
generic plan made then read log_txns with a sequential scan per pushed item (the dedup probe; the table
looked like one page), and kept doing so while the table grew until the next ANALYZE: measured
(benchmarks/sql_push.py) 257 us of PostgreSQL CPU per message of a 100-item push instead of ~13, on a
table of 150,000 rows. The functions now carry ``enable_seqscan = off``: every statement of the push
reads its tables by key whatever the statistics say.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from queen_pg.engine import calls
from queen_pg.engine import push as push_engine
from tests.test_pop_discovery import Plans

PUSH = calls.PUSH
PUSH_FNS = ["queen.push_v3", "queen._push_core"]
KEYED = {"log_txns", "log_partitions", "log_consumers", "log_segments", "queues"}


def call(queues: list[str], per: int, tag: str) -> list[Any]:
    msgs = [push_engine.NewMessage(q, "p0", b'{"n":1}', f"{tag}-{q}-{i}", None) for q in queues for i in range(per)]
    p = push_engine.prepare(msgs)
    return ["default", *p.args_v3(), p.sealed]


@pytest.mark.parametrize("fn", PUSH_FNS)
async def test_the_push_functions_never_plan_a_sequential_scan(conn: asyncpg.Connection, fn: str) -> None:
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = $1::regproc", fn)
    assert config is not None and "enable_seqscan=off" in config and "plan_cache_mode=force_generic_plan" in config


async def test_push_plans_made_on_small_statistics_read_by_key(conn: asyncpg.Connection) -> None:
    """Tables ANALYZEd while nearly empty, then grown: the one-item path, the one-group set path, the
    general path (several groups) and its one-item-per-group statement read every table through an
    index, and find the duplicates."""
    queues = [f"q{g}" for g in range(4)]
    await conn.fetch(PUSH, *call(queues, 1, "first"))  # queues, partitions, 4 rows of log_txns
    await conn.execute("ANALYZE queen.log_txns; ANALYZE queen.log_partitions; ANALYZE queen.queues")
    await conn.execute("ANALYZE queen.log_consumers; ANALYZE queen.log_segments")
    for k in range(30):  # 3,000 more rows in q0/p0 after the statistics were taken
        await conn.fetch(PUSH, *call(["q0"], 100, f"grow{k}"))
    async with Plans(conn) as plans:
        one = await conn.fetchrow(PUSH, *call(["q0"], 1, "grow3"))  # one item, a duplicate
        batch = await conn.fetchrow(PUSH, *call(["q0"], 100, "grow7"))  # 100 duplicates
        fresh = await conn.fetchrow(PUSH, *call(["q0"], 100, "new"))
        groups = await conn.fetchrow(PUSH, *call(queues, 2, "grow5"))  # general path, q0's 2 are duplicates
        singles = await conn.fetchrow(PUSH, *call(queues, 1, "grow9"))  # one item per group, q0's a duplicate
    assert one is not None and list(one["dup_idx"]) == [1]
    assert batch is not None and list(batch["dup_idx"]) == list(range(1, 101))
    assert fresh is not None and list(fresh["dup_idx"]) == []
    assert groups is not None and list(groups["dup_idx"]) == [1, 2]
    assert singles is not None and list(singles["dup_idx"]) == [1]
    scans: list[tuple[str, str]] = []
    for kind, rel, _node, doc in plans.scans(KEYED):
        scans.append((kind, rel))
        assert kind != "Seq Scan", f"{rel} scanned whole: {doc['Query Text'][:300]}"
    assert ("Index Scan", "log_txns") in scans or ("Index Only Scan", "log_txns") in scans, scans
