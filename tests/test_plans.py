"""Plan mode of the hot procedures: the ack and transaction procedures run with generic plans
(``SET plan_cache_mode = force_generic_plan`` on the function). PL/pgSQL kept custom plans for their
array-parameter statements and planned them again on every call (measured: 5-21 % of an ack's or a
transaction's PostgreSQL CPU). The guards here keep the SET clause, and check
that the generic plans of the ack's statements still go through the keys (no scan of a whole table)."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from tests.test_pop_discovery import Plans, fill, nodes, pop

GENERIC = ["queen._ack_settle", "queen.ack_v1", "queen.ack_v3", "queen.transaction_v1"]


@pytest.mark.parametrize("fn", GENERIC)
async def test_the_ack_and_transaction_functions_use_generic_plans(conn: asyncpg.Connection, fn: str) -> None:
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = $1::regproc", fn)
    assert config is not None and "plan_cache_mode=force_generic_plan" in config


async def test_pop_v1_keeps_the_default_plan_mode(conn: asyncpg.Connection) -> None:
    """pop_v1 is NOT forced: PL/pgSQL already plans its discovery and claim generically after five calls
    (forcing measured equal); the namespace/task lookup keeps its custom plans on the namespace key."""
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = 'queen.pop_v1'::regproc")
    assert config is None or not any(c.startswith("plan_cache_mode=") for c in config)


async def ack_v1(conn: asyncpg.Connection, rows: list[asyncpg.Record], lease: uuid.UUID) -> list[asyncpg.Record]:
    """Ack what a pop leased, through queen.ack_v1 (its hashes read back from log_txns)."""
    pids: list[int] = []
    hashes: list[uuid.UUID] = []
    txns: list[str] = []
    for r in rows:
        for off in range(r["lease_start"], r["lease_end"]):
            pid = await conn.fetchval(
                "SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
                " WHERE q.name = 'q' AND p.name = $1",
                r["partition_name"],
            )
            h = await conn.fetchval(
                "SELECT txn_hash FROM queen.log_txns WHERE partition_id = $1 AND msg_offset = $2", pid, off
            )
            pids.append(pid)
            hashes.append(h)
            txns.append(f"t{off}")
    n = len(pids)
    return list(
        await conn.fetch(
            "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7)",
            pids,
            hashes,
            txns,
            [lease] * n,
            ["__QUEUE_MODE__"] * n,
            ["completed"] * n,
            [None] * n,
        )
    )


async def test_generic_ack_plans_use_the_keys(conn: asyncpg.Connection) -> None:
    """3,000 partitions with a pending message each: every statement the ack runs (auto_explain, nested,
    from the first call on) reads log_txns, log_consumers and log_partitions through an index."""
    await fill(conn, "q", 3000)
    await conn.execute("ANALYZE queen.log_consumers; ANALYZE queen.log_partitions; ANALYZE queen.log_txns")
    lease = uuid.UUID("00000000-0000-4000-8000-000000000001")
    claimed = await conn.fetch(
        "SELECT partition_name, lease_start, lease_end FROM queen.pop_v1('default', 'q', NULL, NULL, NULL,"
        " '__QUEUE_MODE__', 3, 3, $1, false, NULL, NULL)",
        lease,
    )
    assert len(claimed) == 3
    async with Plans(conn) as plans:
        answer = await ack_v1(conn, list(claimed), lease)
    assert [(a["success"], a["error"]) for a in answer] == [(True, None)] * 3
    assert answer[-1]["lease_released"]
    watched = {"log_txns", "log_consumers", "log_partitions", "log_segments", "log_passes"}
    scans = []
    for text in plans.notices:
        if "{" not in text:
            continue
        doc = json.loads(text[text.index("{") :])
        for node in nodes(doc["Plan"]):
            rel = node.get("Relation Name")
            if rel in watched:
                scans.append((node["Node Type"], rel))
                if node["Node Type"] == "Seq Scan":
                    rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                    assert rows == 0, f"the ack scans all of {rel}: {doc['Query Text'][:200]}"
    assert ("Index Only Scan", "log_txns") in scans or ("Index Scan", "log_txns") in scans, scans
    # the cursors moved: the next pop gets the next partitions
    assert [r["partition_name"] for r in await pop(conn, "q", group="__QUEUE_MODE__", batch=3, partitions=3)] == [
        "p00003",
        "p00004",
        "p00005",
    ]


async def test_pop_queue_lookup_has_a_generic_plan_on_the_key(conn: asyncpg.Connection) -> None:
    """The queue lookup by name is its own statement: its generic plan reads the (tenant, name) key, so
    PL/pgSQL need not plan it on every pop in a tenant with many queues (one statement with a CASE over
    name or namespace/task had a generic plan reading every queue of the tenant)."""
    await conn.execute(
        "INSERT INTO queen.queues (tenant, name) SELECT 'default', 'z' || i FROM generate_series(1, 3000) i"
    )
    await fill(conn, "q", 2)
    await conn.execute("ANALYZE queen.queues")
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    async with Plans(conn) as plans:
        assert [r["partition_name"] for r in await pop(conn, "q", batch=1)] == ["p00000"]
    lookups = []
    for text in plans.notices:
        if "{" in text:
            doc = json.loads(text[text.index("{") :])
            if "FROM queen.queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue" in " ".join(
                doc["Query Text"].split()
            ):
                lookups.append(doc)
    # the fast path's statement (it finds the group missing) and the general path's lookup
    assert len(lookups) == 2, [json.loads(t[t.index("{") :])["Query Text"][:80] for t in plans.notices if "{" in t]
    for lookup in lookups:
        scans = [n for n in nodes(lookup["Plan"]) if n.get("Relation Name") == "queues"]
        assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [("Index Scan", "queues_tenant_name_key")]
        assert all(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) <= 1 for n in scans)
