"""Status and analytics over real HTTP, fed by the stats job with time passed in (queen.stats_sample_v1
p_now): per-minute pushed/acked deltas, backlog and lag, buckets, pruning, leadership; the process
metrics; and the official client's status helpers (queen-mq 2.6.0). Brokers here run without jobs so
that only the test samples."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from queen_pg.db.locks import STATS_LOCK
from queen_pg.jobs.stats import Stats
from tests.conftest import Broker
from tests.helpers import pop, push

SAMPLE = "SELECT * FROM queen.stats_sample_v1(100, 1, $1, $2)"
DAY = 86400


@pytest.fixture
async def quiet(start_broker: Any) -> Broker:
    b: Broker = await start_broker(jobs_enabled=False)
    return b


@pytest.fixture
async def qhttp(quiet: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=quiet.url, timeout=30) as client:
        yield client


def minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


async def sample(conn: asyncpg.Connection, now: datetime, keep: int = DAY) -> tuple[int, int]:
    row = await conn.fetchrow(SAMPLE, keep, now)
    return row["queues"], row["pruned"]


async def rows(conn: asyncpg.Connection) -> list[tuple[datetime, int, int, int]]:
    got = await conn.fetch("SELECT minute, pushed, acked, backlog FROM queen.stats_minutes ORDER BY minute")
    return [(r["minute"], r["pushed"], r["acked"], r["backlog"]) for r in got]


async def test_samples_count_deltas_per_minute(qhttp: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    t0 = datetime.now(UTC)
    m0 = minute(t0)
    await push(qhttp, "s", [{"payload": i} for i in range(3)])
    assert await sample(conn, t0) == (1, 0)  # a new queue counts its whole history
    assert await sample(conn, t0) == (0, 0)  # sampled less than min_gap ago: skipped
    assert await sample(conn, t0 + timedelta(seconds=2)) == (0, 0)  # nothing happened: not sampled again
    assert await rows(conn) == [(m0, 3, 0, 3)]

    await pop(qhttp, "s", batch=2, autoAck=True)
    await sample(conn, t0 + timedelta(seconds=61))
    assert (await rows(conn))[1] == (m0 + timedelta(minutes=1), 0, 2, 1)
    lag = await conn.fetchval("SELECT lag_seconds FROM queen.stats_minutes ORDER BY minute DESC LIMIT 1")
    assert 55 < lag < 70  # the pending message was written at t0 and sampled at t0 + 61 s

    # a deleted group takes its acked_total with it: the counter went down, the minute counts 0
    assert (await qhttp.delete("/api/v1/consumer-groups/__QUEUE_MODE__")).status_code == 200
    await push(qhttp, "s", [{"payload": 9}])
    await sample(conn, t0 + timedelta(seconds=125))
    assert (await rows(conn))[2][1:3] == (1, 0)

    # pruning: rows older than keep_seconds go, oldest first
    queues, pruned = await sample(conn, t0 + timedelta(hours=3), keep=3600)
    assert queues == 0 and pruned == 3  # idle since its last sample: no new row
    assert await rows(conn) == []


async def test_an_old_queue_starts_from_its_current_counters(
    qhttp: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(qhttp, "legacy", [{"payload": i} for i in range(5)])
    later = datetime.now(UTC) + timedelta(minutes=10)  # first seen long after it was created
    await sample(conn, later)
    assert await rows(conn) == [(minute(later), 0, 0, 5)]


async def test_stats_job_and_its_lock(quiet: Broker, db_url: str, conn: asyncpg.Connection) -> None:
    async with httpx.AsyncClient(base_url=quiet.url) as http:
        await push(http, "j", [{"payload": 1}])
    db = quiet.app.state.queen.db
    job = Stats(keep_hours=1)
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT pg_advisory_xact_lock($1)", STATS_LOCK)
            assert await job.run_once(db) == 0  # another replica leads this tick
    finally:
        await holder.close()
    assert await job.tick(db) == 1
    assert await conn.fetchval("SELECT pushed FROM queen.stats_minutes") == 1


async def test_status_and_analytics_routes(qhttp: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    t0 = datetime.now(UTC)
    m0 = minute(t0)
    await push(qhttp, "a", [{"payload": i} for i in range(4)])
    await push(qhttp, "b", [{"payload": 0}])
    await sample(conn, t0)
    await pop(qhttp, "a", batch=3, autoAck=True)
    await sample(conn, t0 + timedelta(seconds=61))

    window = {"from": iso(m0), "to": iso(m0 + timedelta(minutes=2))}
    r = await qhttp.get("/api/v1/status/analytics", params=window)
    assert r.status_code == 200, r.text
    an = r.json()
    assert an["bucketSeconds"] == 60 and an["interval"] == "minute" and an["queue"] is None
    assert [(s["pushed"], s["acked"], s["backlog"]) for s in an["series"]] == [(5, 0, 5), (0, 3, 2)]
    assert an["series"][0]["time"] == iso(m0).replace("Z", ".000000Z")
    assert an["totals"] == {"pushed": 5, "acked": 3}
    only_a = (await qhttp.get("/api/v1/status/analytics", params={**window, "queue": "a"})).json()
    assert [s["pushed"] for s in only_a["series"]] == [4, 0]
    hourly = (await qhttp.get("/api/v1/status/analytics", params={**window, "interval": "hour"})).json()
    assert len(hourly["series"]) in (1, 2) and hourly["totals"] == {"pushed": 5, "acked": 3}
    empty = (await qhttp.get("/api/v1/status/analytics", params={"to": iso(m0 - timedelta(hours=2))})).json()
    assert len(empty["series"]) == 60 and all(s["pushed"] == 0 and s["backlog"] is None for s in empty["series"])

    assert (await qhttp.post("/api/v1/stats/refresh")).status_code == 200  # the counts are a snapshot
    st = (await qhttp.get("/api/v1/status")).json()
    assert st["status"] == "ok" and st["database"] == "up" and st["queues"] == 2 and st["messages"] == 5
    assert st["throughput"]["lastHour"] == {"pushed": 5, "acked": 3}
    assert set(st["throughput"]["lastMinute"]) == {"minute", "pushed", "acked"}

    sq = (await qhttp.get("/api/v1/status/queues", params=window)).json()
    assert sq["total"] == 2 and [q["name"] for q in sq["queues"]] == ["a", "b"]
    a = sq["queues"][0]
    assert a["throughput"] == {"pushed": 4, "acked": 3} and a["backlog"] == 1 and a["lagSeconds"] >= 0
    assert sq["queues"][1]["lagSeconds"] is None  # no group: nothing pending for anyone yet
    one = (await qhttp.get("/api/v1/status/queues/a", params=window)).json()
    assert one["name"] == "a" and [s["acked"] for s in one["series"]] == [0, 3] and one["totals"]["pushed"] == 4
    assert one["groups"][0]["queueMode"] is True and "partitions" not in one


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("/api/v1/status/analytics", {"interval": "week"}, 400),
        ("/api/v1/status/analytics", {"from": "noon"}, 400),
        ("/api/v1/status/analytics", {"queue": "nope"}, 404),
        ("/api/v1/status/queues", {"limit": 0}, 400),
        ("/api/v1/status/queues", {"to": "2026-01-01T00:00:00"}, 400),  # no zone
        ("/api/v1/status/queues/nope", {}, 404),
        ("/api/v1/status/queues/nope", {"interval": "fortnight"}, 400),
    ],
)
async def test_status_errors(qhttp: httpx.AsyncClient, path: str, params: dict[str, Any], status: int) -> None:
    r = await qhttp.get(path, params=params)
    assert r.status_code == status, r.text
    assert r.json()["code"] == ("not_found" if status == 404 else "bad_request")


async def test_process_metrics(qhttp: httpx.AsyncClient) -> None:
    sm = (await qhttp.get("/api/v1/analytics/system-metrics")).json()
    assert sm["pid"] > 0 and sm["uptimeSeconds"] >= 0 and sm["cpuSeconds"] > 0 and sm["maxRssBytes"] > 0
    assert sm["pool"]["max"] == 5 and sm["pool"]["size"] >= 1 and sm["longPoll"] == {"parked": 0, "limit": 10000}
    assert sm["maintenance"] == {"push": False, "pop": False} and "maintenance_refresh" in sm["jobs"]
    wm = (await qhttp.get("/api/v1/analytics/worker-metrics")).json()
    assert [w["pid"] for w in wm["workers"]] == [sm["pid"]]


async def test_official_client_status_helpers(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("cs").push([{"data": {"i": 1}}])
        status = await client.admin.get_status()
        assert status["queues"] == 1 and status["maintenance"] == {"push": False, "pop": False}
        stats = await client.admin.get_queue_stats(limit=5)
        assert stats["queues"][0]["name"] == "cs" and stats["queues"][0]["messages"] == 1
        detail = await client.admin.get_queue_detail("cs", interval="hour")
        assert detail["name"] == "cs" and detail["bucketSeconds"] == 3600
        analytics = await client.admin.get_analytics(queue="cs")
        assert len(analytics["series"]) in (60, 61)  # the buckets holding now - 1 h .. now
        assert (await client.admin.get_system_metrics())["pool"]["max"] == 5
        assert len((await client.admin.get_worker_metrics())["workers"]) == 1
        assert (await client.admin.health())["status"] == "healthy"


async def test_an_idle_queue_is_not_sampled_and_still_counts(
    qhttp: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """The stats job samples only the queues whose pushed or acked counter moved since their mark; an idle
    queue writes nothing, yet the tenant's analytics still count its backlog and lag, a single queue's
    series carries them through its idle minutes, and the counts are those of sampling every queue."""
    t0 = datetime.now(UTC) + timedelta(seconds=5)  # the queues below are new (< 1 min) at t0
    m0 = minute(t0)
    await push(qhttp, "busy", [{"payload": i} for i in range(2)])  # no group: backlog = retained
    await push(qhttp, "idle", [{"payload": i} for i in range(3)])
    await pop(qhttp, "idle", batch=1, autoAck=True)  # a group with 2 pending: a lag
    for i in range(20):  # queues with nothing pending: idle from then on
        await push(qhttp, f"empty{i}", [{"payload": 0}])
        await pop(qhttp, f"empty{i}", batch=1, autoAck=True)
    assert await sample(conn, t0) == (22, 0)
    marks = await conn.fetch("SELECT * FROM queen.stats_marks ORDER BY queue_id")

    await push(qhttp, "busy", [{"payload": 9}])
    assert await sample(conn, m0 + timedelta(seconds=61)) == (1, 0)  # only "busy" moved
    after = await conn.fetch("SELECT * FROM queen.stats_marks ORDER BY queue_id")
    busy_id = await conn.fetchval("SELECT id FROM queen.queues WHERE name = 'busy'")
    assert [m for m in after if m["queue_id"] != busy_id] == [m for m in marks if m["queue_id"] != busy_id]
    assert await conn.fetchval("SELECT count(*) FROM queen.stats_minutes WHERE minute > $1", m0) == 1

    # an ack alone (no push) is activity: the idle queue is sampled at the next tick and its ack counts
    await pop(qhttp, "idle", batch=1, autoAck=True)
    assert await sample(conn, m0 + timedelta(seconds=121)) == (1, 0)
    idle_rows = await conn.fetch(
        "SELECT minute, pushed, acked, backlog FROM queen.stats_minutes s JOIN queen.queues q ON q.id = s.queue_id"
        " WHERE q.name = 'idle' ORDER BY minute"
    )
    assert [(r["minute"], r["pushed"], r["acked"], r["backlog"]) for r in idle_rows] == [
        (m0, 3, 1, 2),
        (m0 + timedelta(minutes=2), 0, 1, 1),
    ]

    window = {"from": iso(m0), "to": iso(m0 + timedelta(minutes=3))}
    whole = (await qhttp.get("/api/v1/status/analytics", params=window)).json()
    # backlog over every queue's last sample: busy 2 then 3; idle 2 (carried through minute 1) then 1
    assert [(s["pushed"], s["acked"], s["backlog"]) for s in whole["series"]] == [(25, 21, 4), (1, 0, 5), (0, 1, 4)]
    assert whole["totals"] == {"pushed": 26, "acked": 22}
    lags = [s["lagSeconds"] for s in whole["series"]]
    assert None not in lags and lags[0] < lags[1] < lags[2]  # the idle queue's oldest message ages
    one = (await qhttp.get("/api/v1/status/analytics", params={**window, "queue": "idle"})).json()
    assert [(s["pushed"], s["acked"], s["backlog"]) for s in one["series"]] == [(3, 1, 2), (0, 0, 2), (0, 1, 1)]
    lags = [s["lagSeconds"] for s in one["series"]]
    assert lags[1] == pytest.approx(lags[0] + 60)  # carried through the idle minute, grown by it


async def test_a_cursor_moved_without_an_ack_is_sampled_again(
    qhttp: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Only moved queues are sampled, but "moved" is more than the pushed and acked counters: clearing a
    queue, seeking a group, creating or deleting a group change its backlog and lag with neither counter
    moving. Such a queue must be sampled again (else its backlog is carried forever)."""
    t0 = datetime.now(UTC) + timedelta(seconds=5)
    m0 = minute(t0)
    await push(qhttp, "c", [{"payload": i} for i in range(3)])
    await pop(qhttp, "c", batch=1, autoAck=True)  # queue mode: 2 pending
    assert await sample(conn, t0) == (1, 0)
    assert await conn.fetchval("SELECT backlog FROM queen.stats_marks") == 2

    r = await qhttp.delete("/api/v1/queues/c/clear")
    assert r.status_code == 200, r.text
    assert await sample(conn, m0 + timedelta(seconds=61)) == (1, 0)
    assert await conn.fetchval("SELECT backlog FROM queen.stats_marks") == 0
    window = {"from": iso(m0), "to": iso(m0 + timedelta(minutes=2))}
    one = (await qhttp.get("/api/v1/status/analytics", params={**window, "queue": "c"})).json()
    assert [s["backlog"] for s in one["series"]] == [2, 0]

    # idle again: no new sample
    assert await sample(conn, m0 + timedelta(seconds=121)) == (0, 0)
