"""/status and /resources/overview from the per-tenant snapshot (queen.tenant_stats): the
counts are the stats_snapshot job's (asOf/ageSeconds say how old), POST /stats/refresh recomputes the
caller's tenant's at once, the snapshot equals the per-queue summaries it replaces, a tenant sees only
its own, and EXPLAIN/row-count guards prove a read touches no per-queue row at a few thousand queues."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx

from queen_pg.db.locks import STATS_SNAPSHOT_LOCK
from queen_pg.db.pool import Database
from queen_pg.jobs.stats import SNAPSHOT_CONFIG, StatsSnapshot
from tests.conftest import Broker
from tests.helpers import push

PER_QUEUE_TABLES = ("queues", "log_partitions", "log_consumers", "log_groups", "log_dlq", "log_segments",
                    "stats_minutes", "stats_marks")  # fmt: skip


async def test_overview_reads_the_snapshot_until_refreshed(start_broker: Any, db: Database) -> None:
    b: Broker = await start_broker(jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await push(http, "s", [{"payload": i} for i in range(3)])
        live = (await http.get("/api/v1/resources/overview")).json()
        assert live["messages"] == 3 and live["asOf"] == live["timestamp"]  # no snapshot yet: computed now
        assert await StatsSnapshot().run_once(db) == 1
        first = (await http.get("/api/v1/resources/overview")).json()
        assert first["messages"] == 3 and first["ageSeconds"] >= 0
        await push(http, "s", [{"payload": i} for i in range(2)])
        stale = (await http.get("/api/v1/resources/overview")).json()
        assert stale["messages"] == 3 and stale["asOf"] == first["asOf"]  # the snapshot, as its asOf says
        status = (await http.get("/api/v1/status")).json()
        assert status["messages"] == 3 and status["asOf"] == first["asOf"] and status["status"] == "ok"
        r = await http.post("/api/v1/stats/refresh")
        assert r.status_code == 200 and r.json()["refreshed"] is True
        fresh = (await http.get("/api/v1/resources/overview")).json()
        assert fresh["messages"] == 5 and fresh["asOf"] == r.json()["asOf"] and fresh["asOf"] > first["asOf"]
        assert (await http.get("/api/v1/status")).json()["messages"] == 5
        # a tick within half an interval of the last refresh skips the tenant; a later one takes it
        assert await StatsSnapshot().run_once(db) == 0
        assert await StatsSnapshot().run_once(db, datetime.now(UTC).replace(year=2100)) == 1
        # every queue deleted: the row goes, and the overview is computed (zeros) again
        assert (await http.delete("/api/v1/resources/queues/s")).status_code in (200, 204)
        assert await StatsSnapshot().run_once(db) == 0
        assert await db.fetchval("SELECT count(*) FROM queen.tenant_stats") == 0
        gone = (await http.get("/api/v1/resources/overview")).json()
        assert gone["queues"] == 0 and gone["messages"] == 0


async def test_snapshot_equals_the_per_queue_summaries(start_broker: Any, conn: asyncpg.Connection) -> None:
    """The set-based pass gives what summing queen._queue_summary over every queue gave (the old overview)."""
    b: Broker = await start_broker(jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "d", "namespace": "ns", "task": "t",
                                                     "options": {"retryLimit": 0}})  # fmt: skip
        await push(http, "a", [{"payload": i} for i in range(5)], partition="p1")
        await push(http, "a", [{"payload": i} for i in range(3)], partition="p2")
        await push(http, "c", [{"payload": 1}])  # no group: backlog = retained
        await push(http, "d", [{"payload": i} for i in range(4)])
        leased = (await http.get("/api/v1/pop/queue/a", params={"consumerGroup": "g1", "batch": 2})).json()
        await http.get("/api/v1/pop/queue/a/partition/p2", params={"consumerGroup": "g2", "batch": 10,
                                                                  "autoAck": "true"})  # fmt: skip
        msg = (await http.get("/api/v1/pop/queue/d", params={"batch": 1})).json()["messages"][0]
        keys = ("transactionId", "partitionId", "leaseId")
        r = await http.post("/api/v1/ack", json={**{k: msg[k] for k in keys}, "status": "failed"})
        assert r.status_code == 200, r.text
        assert len(leased["messages"]) == 2
        await http.post("/api/v1/stats/refresh")
        snap = (await http.get("/api/v1/resources/overview")).json()
    old = json.loads(
        await conn.fetchval(
            """
            WITH q AS (SELECT q.namespace, q.task, queen._queue_summary(q.id, now()) AS s
                         FROM queen.queues q WHERE q.tenant = 'default')
            SELECT jsonb_build_object(
                'queues', count(*), 'partitions', sum((q.s ->> 'partitions')::bigint),
                'messages', sum((q.s ->> 'messages')::bigint), 'retained', sum((q.s ->> 'retained')::bigint),
                'backlog', sum((q.s ->> 'backlog')::bigint), 'inFlight', sum((q.s ->> 'inFlight')::bigint),
                'dlq', sum((q.s ->> 'dlq')::bigint),
                'consumerGroups', sum(jsonb_array_length(q.s -> 'groups')),
                'namespaces', count(DISTINCT q.namespace), 'tasks', count(DISTINCT q.task))::text FROM q
            """
        )
    )
    assert old["dlq"] == 1 and old["inFlight"] == 2 and old["consumerGroups"] == 3  # the world is varied
    assert {k: snap[k] for k in old} == old


async def test_a_tenant_sees_only_its_own_figures(start_broker: Any) -> None:
    b: Broker = await start_broker(tenancy_header=True, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        a, z = {"x-queen-tenant": "ta"}, {"x-queen-tenant": "tz"}
        r = await http.post("/api/v1/push", json={"items": [{"queue": "x", "payload": i} for i in range(4)]}, headers=a)
        assert r.status_code == 201
        await http.post("/api/v1/push", json={"items": [{"queue": "y", "payload": 1}]}, headers=z)
        await http.post("/api/v1/stats/refresh", headers=a)  # refreshes ta only
        ov_a = (await http.get("/api/v1/resources/overview", headers=a)).json()
        ov_z = (await http.get("/api/v1/status", headers=z)).json()
        assert (ov_a["queues"], ov_a["messages"]) == (1, 4)
        assert (ov_z["queues"], ov_z["messages"]) == (1, 1)
        other = (await http.get("/api/v1/resources/overview", headers={"x-queen-tenant": "nobody"})).json()
        assert other["queues"] == 0 and other["messages"] == 0


async def test_the_job_yields_to_another_replica(db: Database, db_url: str, conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO queen.queues (tenant, name) VALUES ('default', 'q')")
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT pg_advisory_xact_lock($1)", STATS_SNAPSHOT_LOCK)
            assert await StatsSnapshot().run_once(db) == 0
            assert await conn.fetchval("SELECT count(*) FROM queen.tenant_stats") == 0
    finally:
        await holder.close()
    assert await StatsSnapshot().run_once(db) == 1


async def _make_queues(conn: asyncpg.Connection, n: int, tenant: str = "default") -> None:
    """n queues with one partition of 10 messages and a queue-mode cursor at 4, straight in SQL."""
    await conn.execute(
        """
        WITH q AS (INSERT INTO queen.queues (tenant, name)
                   SELECT $2, 'q' || g FROM generate_series(1, $1) g RETURNING id),
        p AS (INSERT INTO queen.log_partitions (tenant, queue_id, name, next_offset)
              SELECT $2, q.id, 'Default', 10 FROM q RETURNING id, queue_id),
        g AS (INSERT INTO queen.log_groups (queue_id, name, tenant)
              SELECT q.id, '__QUEUE_MODE__', $2 FROM q)
        INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset)
        SELECT p.id, '__QUEUE_MODE__', p.queue_id, $2, 4 FROM p
        """,
        n,
        tenant,
    )
    await conn.execute("ANALYZE")


async def _touched(conn: asyncpg.Connection, sql: str, *args: Any) -> dict[str, int]:
    """Rows (sequentially or by index) and scans of each table by ``sql``: the growth of this backend's
    not yet reported counters (pg_stat_xact_user_tables) across the call."""
    counters = (
        "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
        " + coalesce(seq_scan, 0) + coalesce(idx_scan, 0) AS n"
        " FROM pg_stat_xact_user_tables WHERE schemaname = 'queen'"
    )
    async with conn.transaction():
        before = {r["relname"]: int(r["n"]) for r in await conn.fetch(counters)}
        await conn.fetchval(sql, *args)
        after = {r["relname"]: int(r["n"]) for r in await conn.fetch(counters)}
    return {t: n - before.get(t, 0) for t, n in after.items()}


async def test_guard_overview_and_status_read_no_per_queue_row(db: Database, conn: asyncpg.Connection) -> None:
    await _make_queues(conn, 3000)
    assert await StatsSnapshot().run_once(db) == 1
    for sql in ("SELECT queen.resources_overview_v1('default')", "SELECT queen.status_v1('default')"):
        touched = await _touched(conn, sql)
        # a handful of index probes at most (the planner's range estimates for the live branch, which
        # does not run): nothing that grows with the 3,000 queues
        assert all(touched.get(t, 0) <= 20 for t in PER_QUEUE_TABLES), (sql, touched)
        assert touched.get("tenant_stats", 0) >= 1, touched  # it did read the snapshot
    ov = json.loads(await conn.fetchval("SELECT queen.resources_overview_v1('default')::text"))
    assert (ov["queues"], ov["messages"], ov["backlog"]) == (3000, 30000, 18000)
    # the guard can fail: without a snapshot the same call reads every queue's rows
    await conn.execute("DELETE FROM queen.tenant_stats")
    touched = await _touched(conn, "SELECT queen.resources_overview_v1('default')")
    assert touched.get("log_partitions", 0) >= 3000 and touched.get("queues", 0) >= 3000, touched


async def test_explain_guard_the_snapshot_read_is_one_index_probe(db: Database, conn: asyncpg.Connection) -> None:
    """The plans of the statements inside the overview and status, seen through auto_explain."""
    await _make_queues(conn, 3000)
    await StatsSnapshot().run_once(db)
    notices: list[str] = []
    conn.add_log_listener(lambda _c, msg: notices.append(str(msg.message)))
    await conn.execute("LOAD 'auto_explain'")
    for name, value in (("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice"),
                        ("log_format", "json"), ("log_analyze", "on")):  # fmt: skip
        await conn.execute(f"SET auto_explain.{name} = '{value}'")
    await conn.fetchval("SELECT queen.status_v1('default')")
    await conn.execute("RESET auto_explain.log_min_duration")
    await conn.execute("SET auto_explain.log_min_duration = -1")
    plans = [json.loads(n[n.index("{") :]) for n in notices if "Plan" in n]
    assert plans, notices

    def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
        out = [plan]
        for child in plan.get("Plans", []):
            out += nodes(child)
        return out

    # the nodes that ran (the live fallback's branch is planned but never executed while a row exists)
    scanned = [(n["Node Type"], n.get("Relation Name"), n.get("Actual Rows"))
               for p in plans for n in nodes(p["Plan"])
               if "Relation Name" in n and n.get("Actual Loops", 0) > 0]  # fmt: skip
    relations = {rel for _, rel, _ in scanned}
    assert "tenant_stats" in relations and "tenant_minutes" in relations, scanned
    assert not relations & set(PER_QUEUE_TABLES), scanned
    assert all(rows <= 61 for _, _, rows in scanned), scanned  # one snapshot row, at most 61 minutes


async def test_a_long_pass_stretches_the_jobs_sleep(db: Database, conn: asyncpg.Connection) -> None:
    job = StatsSnapshot()
    assert job.idle_delay() == job.config.interval
    await _make_queues(conn, 2000)
    assert await job.run_once(db) == 1
    assert job.last_pass_s > 0
    job.last_pass_s = 3.5  # what a pass over 100,000 queues took on the 2-core machine
    assert job.idle_delay() == 35.0  # PostgreSQL busy with it at most a tenth of the time


async def test_a_tick_ends_when_there_are_more_tenants_than_its_batch(db: Database, conn: asyncpg.Connection) -> None:
    """More tenants than `limit`: a tick takes batches until none is due, but a tenant it refreshed
    becomes due again `min_gap_seconds` later (0 with an interval under 2 s; or a sweep that takes longer
    than the gap: 1,000 small tenants). The tick must not take them again: it ends, every tenant
    refreshed once, and the job sleeps (the share of PostgreSQL it may use holds)."""
    for t in range(5):
        await _make_queues(conn, 1, tenant=f"t{t}")
    job = StatsSnapshot(replace(SNAPSHOT_CONFIG, interval=0.5, limit=2))  # min gap 0: always due
    assert job.min_gap_seconds == 0
    done = await asyncio.wait_for(job.tick(db), 10)  # before the fix: never returned
    assert 1 <= done <= 5
    assert job.last_pass_s > 0  # the tick's length: what idle_delay() stretches the sleep by
    # the ticks that follow refresh the rest, oldest (or never refreshed) first
    for _ in range(5):
        await asyncio.wait_for(job.tick(db), 30)
    assert await conn.fetchval("SELECT count(*) FROM queen.tenant_stats") == 5
