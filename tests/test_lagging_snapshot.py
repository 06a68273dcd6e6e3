"""/consumer-groups/lagging and the whole-tenant /status/analytics read maintained data:
lagging groups from the tenant's snapshot (queen.group_lag, written with tenant_stats by the
stats_snapshot job; POST /stats/refresh recomputes it), analytics from the per-tenant minute rows the
stats job writes; the answers keep their shapes, and row-count guards prove neither reads a row per
queue or per cursor at a few thousand queues (and that the guards can fail)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from queen_pg.db.pool import Database
from queen_pg.jobs.stats import StatsSnapshot
from tests.conftest import Broker
from tests.helpers import pop, push, push_at
from tests.test_status_snapshot import _touched

PER_QUEUE_TABLES = ("queues", "log_partitions", "log_consumers", "log_groups", "log_segments", "stats_minutes",
                    "stats_marks")  # fmt: skip
LAGGING = "SELECT queen.consumer_groups_lagging_v1('default', 60, 10, 0)::text"


async def test_lagging_reads_the_snapshot_until_refreshed(start_broker: Any, conn: asyncpg.Connection) -> None:
    b: Broker = await start_broker(jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        old = datetime.now(UTC) - timedelta(minutes=5)
        await push_at(conn, "old", ["a", "b", "c"], old)
        await pop(http, "old", consumerGroup="slow", batch=1, autoAck=True)  # "b" waits since 5 min
        await push(http, "fresh", [{"payload": 1}])
        await pop(http, "fresh", consumerGroup="slow", batch=1)  # leased, fresh: not lagging

        live = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 60})).json()
        assert live["total"] == 1 and live["asOf"]  # no snapshot yet: computed now

        refreshed = (await http.post("/api/v1/stats/refresh")).json()
        snap = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 60})).json()
        assert snap["asOf"] == refreshed["asOf"]
        assert {k: v for k, v in snap.items() if k != "asOf"} | {"groups": None} == (
            {k: v for k, v in live.items() if k != "asOf"} | {"groups": None}
        )
        (g,) = snap["groups"]
        assert set(g) == set(live["groups"][0])  # the same shape as the live answer
        assert g["name"] == "slow" and g["queue"] == "old" and g["lag"] == 2 and g["partitionsBehind"] == 1
        assert g["queueMode"] is False and g["partitions"] == 1 and 290 < g["lagSeconds"] < 400
        assert g["oldestPendingAt"] == live["groups"][0]["oldestPendingAt"]
        everyone = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 0})).json()
        assert everyone["total"] == 2 and [x["queue"] for x in everyone["groups"]] == ["old", "fresh"]
        page = (await http.get("/api/v1/consumer-groups/lagging",
                               params={"minLagSeconds": 0, "limit": 1, "offset": 1})).json()  # fmt: skip
        assert page["total"] == 2 and [x["queue"] for x in page["groups"]] == ["fresh"]

        # the group catches up: the snapshot still shows it (as its asOf says) until the next refresh
        await pop(http, "old", consumerGroup="slow", batch=10, autoAck=True)
        stale = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 60})).json()
        assert stale["total"] == 1 and stale["asOf"] == snap["asOf"]
        assert (await http.post("/api/v1/stats/refresh")).status_code == 200
        after = (await http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 60})).json()
        assert after["total"] == 0 and after["groups"] == [] and after["asOf"] > snap["asOf"]

        # a deleted queue takes its rows with it
        await http.post("/api/v1/stats/refresh")
        assert await conn.fetchval("SELECT count(*) FROM queen.group_lag") == 1  # "fresh" (leased, pending)
        assert (await http.delete("/api/v1/resources/queues/fresh")).status_code in (200, 204)
        assert await conn.fetchval("SELECT count(*) FROM queen.group_lag") == 0


async def _lagging_world(conn: asyncpg.Connection, n: int) -> None:
    """n queues of one partition (10 messages) and a queue-mode cursor at 4; a third of them with their
    oldest pending message an hour old, the others a second old (straight in SQL)."""
    await conn.execute(
        """
        WITH q AS (INSERT INTO queen.queues (tenant, name)
                   SELECT 'default', 'q' || g FROM generate_series(1, $1) g RETURNING id),
        p AS (INSERT INTO queen.log_partitions (tenant, queue_id, name, next_offset)
              SELECT 'default', q.id, 'Default', 10 FROM q RETURNING id, queue_id),
        g AS (INSERT INTO queen.log_groups (queue_id, name, tenant)
              SELECT q.id, '__QUEUE_MODE__', 'default' FROM q)
        INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset, head_at)
        SELECT p.id, '__QUEUE_MODE__', p.queue_id, 'default', 4,
               now() - CASE WHEN p.queue_id % 3 = 0 THEN interval '1 hour' ELSE interval '1 second' END
          FROM p
        """,
        n,
    )
    await conn.execute("ANALYZE")


async def test_guard_lagging_reads_no_cursor_row(db: Database, conn: asyncpg.Connection) -> None:
    await _lagging_world(conn, 3000)
    assert await StatsSnapshot().run_once(db) == 1
    touched = await _touched(conn, LAGGING)
    assert all(touched.get(t, 0) <= 20 for t in PER_QUEUE_TABLES if t != "queues"), touched
    assert touched.get("queues", 0) <= 20, touched  # the names of the page's 10 rows only
    assert touched.get("group_lag", 0) >= 1000, touched  # the lagging rows (the answer's total), by index
    snap = json.loads(await conn.fetchval(LAGGING))
    assert snap["total"] == 1000 and len(snap["groups"]) == 10 and snap["groups"][0]["lag"] == 6
    # the guard can fail: without a snapshot the same call reads every cursor row, with the same answer
    await conn.execute("DELETE FROM queen.tenant_stats")
    touched = await _touched(conn, LAGGING)
    assert touched.get("log_consumers", 0) >= 3000, touched
    live = json.loads(await conn.fetchval(LAGGING))
    assert {k: v for k, v in live.items() if k not in ("asOf", "groups")} == {
        k: v for k, v in snap.items() if k not in ("asOf", "groups")
    }
    strip = [{k: v for k, v in x.items() if k != "lagSeconds"} for x in live["groups"]]
    assert strip == [{k: v for k, v in x.items() if k != "lagSeconds"} for x in snap["groups"]]


async def test_guard_tenant_analytics_reads_no_per_queue_row(db: Database, conn: asyncpg.Connection) -> None:
    await _lagging_world(conn, 3000)
    now = datetime.now(UTC)
    await conn.fetch("SELECT * FROM queen.stats_sample_v1(10000, 1, 0, $1)", now)
    assert await conn.fetchval("SELECT count(*) FROM queen.stats_minutes") == 3000
    frm = now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    sql = "SELECT queen.analytics_v1('default', NULL, $1, $2, 60)::text"
    touched = await _touched(conn, sql, frm, now + timedelta(minutes=1))
    assert all(touched.get(t, 0) <= 20 for t in PER_QUEUE_TABLES), touched
    assert touched.get("tenant_minutes", 0) >= 1, touched
    series = json.loads(await conn.fetchval(sql, frm, now + timedelta(minutes=1)))["series"]
    assert len(series) == 61 and series[-2]["backlog"] == 3000 * 6  # every queue's backlog, from one row
    # the same read for one queue reads that queue's rows only
    one = await _touched(conn, "SELECT queen.analytics_v1('default', 'q7', $1, $2, 60)::text", frm, now)
    assert one.get("stats_minutes", 0) <= 200 and one.get("log_consumers", 0) == 0, one


async def test_a_snapshot_pass_rewrites_only_the_lagging_rows_that_changed(
    db: Database, conn: asyncpg.Connection
) -> None:
    """An unchanged group_lag row is not written, nor even locked (xmin and xmax stay): no dead rows, and
    the lagging read stays an index-only scan; a changed one is updated, a caught-up one deleted."""
    await _lagging_world(conn, 300)
    assert await StatsSnapshot().run_once(db) == 1
    rows = "SELECT queue_id, xmin::text AS xmin, xmax::text AS xmax, lag FROM queen.group_lag ORDER BY queue_id"
    before = await conn.fetch(rows)
    assert len(before) == 300 and all(r["xmax"] == "0" for r in before)
    moved, done = before[0]["queue_id"], before[1]["queue_id"]
    await conn.execute("UPDATE queen.log_consumers SET cursor_offset = 6 WHERE queue_id = $1", moved)
    await conn.execute("UPDATE queen.log_consumers SET cursor_offset = 10 WHERE queue_id = $1", done)
    assert await StatsSnapshot().run_once(db, datetime.now(UTC) + timedelta(hours=1)) == 1
    after = {r["queue_id"]: r for r in await conn.fetch(rows)}
    assert done not in after and after[moved]["lag"] == 4 and after[moved]["xmin"] != before[0]["xmin"]
    untouched = [r for r in before if r["queue_id"] not in (moved, done)]
    assert all(after[r["queue_id"]]["xmin"] == r["xmin"] and after[r["queue_id"]]["xmax"] == "0" for r in untouched)
