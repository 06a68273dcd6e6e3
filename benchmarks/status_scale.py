"""Status at scale: ``/api/v1/status``, ``/api/v1/resources/overview``, ``/metrics``,
``/api/v1/status/analytics`` and ``/api/v1/consumer-groups/lagging`` at 1,000, 10,000 and 100,000 queues.

One broker (``queen-pg serve``, its own embedded PostgreSQL). Queues are made straight in SQL in
batches (one partition of 10 messages each, a queue-mode cursor at 4: backlog 6; one queue in ten
with its oldest pending message 10 minutes old, the others 10 seconds), with progress output. At each
size: one ``POST /api/v1/stats/refresh`` (the snapshot pass the stats_snapshot job makes every few
seconds; its cost is reported), then N sequential GETs of each route (p50/p99 wall
clock; broker and PostgreSQL CPU µs per request from /proc), the byte size of ``/metrics`` and of one
``/metrics/queues`` page; ``/status/analytics`` (the last hour, whole tenant) and
``/consumer-groups/lagging?minLagSeconds=60`` (one page of 100 of the 10 % lagging) as the dashboard
polls them. Writes ``benchmarks/results/<date>-<commit>-status.json`` with the machine and git commit.

    make bench-status                      # 1k, 10k, 100k
    make bench-status BENCH_ARGS="--sizes 1000,5000 --requests 20"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmarks.broker import BrokerProcess
from benchmarks.machine import loadavg, machine_info, result_path
from benchmarks.procstat import CpuWindow

BATCH = 5000

MAKE_SQL = """
WITH q AS (INSERT INTO queen.queues (tenant, name)
           SELECT 'default', 'bench-' || lpad(g::text, 7, '0') FROM generate_series($1::int, $2::int) g
           RETURNING id),
p AS (INSERT INTO queen.log_partitions (tenant, queue_id, name, next_offset)
      SELECT 'default', q.id, 'Default', 10 FROM q RETURNING id, queue_id),
g AS (INSERT INTO queen.log_groups (queue_id, name, tenant) SELECT q.id, '__QUEUE_MODE__', 'default' FROM q)
INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset, head_at)
SELECT p.id, '__QUEUE_MODE__', p.queue_id, 'default', 4,
       now() - CASE WHEN p.queue_id % 10 = 0 THEN interval '10 minutes' ELSE interval '10 seconds' END FROM p
"""


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def grow(conn: asyncpg.Connection, have: int, want: int) -> None:
    started = time.monotonic()
    while have < want:
        upto = min(have + BATCH, want)
        await conn.execute(MAKE_SQL, have + 1, upto)
        have = upto
        print(f"  queues: {have:>7,} ({time.monotonic() - started:.1f} s)", flush=True)
    await conn.execute("ANALYZE queen.queues, queen.log_partitions, queen.log_groups, queen.log_consumers")


async def timed(http: httpx.AsyncClient, path: str, n: int, root: int) -> dict[str, Any]:
    walls: list[float] = []
    size = 0
    cpu = CpuWindow(root)
    cpu.begin()
    t0 = time.monotonic()
    for _ in range(n):
        s = time.perf_counter()
        r = await http.get(path)
        walls.append((time.perf_counter() - s) * 1000)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
        size = len(r.content)
    elapsed = time.monotonic() - t0
    use = cpu.end()
    return {
        "p50_ms": round(statistics.median(walls), 2),
        "p99_ms": round(pct(walls, 99), 2),
        "bytes": size,
        "broker_us_per_req": round(use.get("broker", 0.0) * elapsed / n * 1e6),
        "postgres_us_per_req": round(use.get("postgres", 0.0) * elapsed / n * 1e6),
        "machine_other_cores": use.get("other"),
    }


async def run(sizes: list[int], requests: int, jobs: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine_info(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "sizes": {}, "jobs": jobs}  # fmt: skip
    with BrokerProcess(env={} if jobs else {"QUEEN_JOBS_ENABLED": "false"}) as b:
        conn = await asyncpg.connect(b.pg_dsn())
        have = 0
        async with httpx.AsyncClient(base_url=b.url, timeout=120) as http:
            for n in sizes:
                print(f"{n:,} queues", flush=True)
                await grow(conn, have, n)
                have = n
                s = time.perf_counter()
                r = await http.post("/api/v1/stats/refresh")
                refresh_ms = (time.perf_counter() - s) * 1000
                assert r.status_code == 200 and r.json()["refreshed"], r.text
                took = await conn.fetchval("SELECT took_ms FROM queen.tenant_stats WHERE tenant = 'default'")
                row: dict[str, Any] = {
                    "snapshot_pass_ms": round(float(took), 1),
                    "refresh_call_ms": round(refresh_ms, 1),
                }
                ov = (await http.get("/api/v1/resources/overview")).json()
                assert ov["queues"] == n and ov["backlog"] == 6 * n, ov
                for name, path in (
                    ("status", "/api/v1/status"),
                    ("overview", "/api/v1/resources/overview"),
                    ("metrics", "/metrics"),
                    ("metrics_queues_page", "/metrics/queues?limit=1000"),
                    ("analytics", "/api/v1/status/analytics"),
                    ("lagging", "/api/v1/consumer-groups/lagging?minLagSeconds=60&limit=100"),
                ):
                    row[name] = await timed(http, path, requests if name != "metrics_queues_page" else 5, b.pid)
                lag = (await http.get("/api/v1/consumer-groups/lagging?minLagSeconds=60&limit=100")).json()
                assert lag["total"] == n // 10 and len(lag["groups"]) == min(100, n // 10), lag["total"]
                results["sizes"][str(n)] = row
                print(json.dumps(row), flush=True)
        await conn.close()
    results["machine"]["loadavg_end"] = loadavg()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="queue counts, ascending")
    ap.add_argument("--requests", type=int, default=50, help="GETs per route and size")
    ap.add_argument("--out", type=Path, help="[benchmarks/results/<date>-<commit>-status[-nojobs].json]")
    ap.add_argument("--no-jobs", action="store_true", help="background jobs off: the reads alone")
    a = ap.parse_args()
    sizes = sorted(int(x) for x in a.sizes.split(","))
    out = a.out or result_path("status-nojobs" if a.no_jobs else "status")
    res = asyncio.run(run(sizes, a.requests, not a.no_jobs))
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
