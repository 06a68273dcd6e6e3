"""PostgreSQL CPU and round-trip time of ten consumer groups' claims: ten ``queen.pop_v1`` calls against one
``queen.pop_many_v1`` call (pop fusion, queen_pg/engine/fusion.py), A/B in alternating rounds.

Starts an embedded PostgreSQL (test-fixture fast mode), fills one queue with 10 partitions of 100-message
segments (the benchmark's pushes), then, per round, claims for ten groups ``--pops`` times: "alone" as
ten pop_v1 calls one after the other (what ten woken long polls cost today without fusion), "fused" as
one pop_many_v1 call for the ten (other groups, so each arm reads the queue from its start). autoAck
(the cursor moves, nothing stays leased) with ``--batch`` messages per claim. The backend's CPU comes
from /proc/<pid>/schedstat; the wall time is the client's, per ten claims.
Usage: ``python -m benchmarks.sql_pop_many [--rounds 3] [--pops 100] [--groups 10] [--batch 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from benchmarks.broker import free_port
from benchmarks.sql_pop import _fill
from benchmarks.sql_push import backend_cpu_ns
from queen_pg.db.apply import apply_sql
from queen_pg.embedded_pg import EmbeddedPostgres
from queen_pg.engine.pop import POP_MANY_SQL, POP_SQL


async def _alone(conn: asyncpg.Connection, groups: list[str], batch: int) -> int:
    rows = 0
    for g in groups:
        got = await conn.fetch(POP_SQL, "default", "fan", None, None, None, g, batch, 1, uuid.uuid4(), True,
                               "all", None, None)  # fmt: skip
        rows += len(got)
    return rows


async def _fused(conn: asyncpg.Connection, groups: list[str], batch: int) -> int:
    n = len(groups)
    got = await conn.fetch(POP_MANY_SQL, "default", "fan", [None] * n, groups, [batch] * n, [1] * n,
                           [uuid.uuid4() for _ in groups], [True] * n, ["all"] * n, [None] * n, [None] * n)  # fmt: skip
    return len(got)


async def bench(pg: EmbeddedPostgres, rounds: int, pops: int, ngroups: int, batch: int) -> None:
    conn = await asyncpg.connect(pg.admin_dsn())
    await apply_sql(conn, None)
    await _fill(conn, "fan", (rounds * pops * batch + 99) // 100 + 10)
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    arms = {"alone": _alone, "fused": _fused}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    wall: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(rounds):
        for arm, run in arms.items():
            groups = [f"{arm}-{g}" for g in range(ngroups)]
            await run(conn, groups, batch)  # creates the groups (not measured)
            c0, w0, rows = backend_cpu_ns(pid), time.perf_counter(), 0
            for _ in range(pops):
                rows += await run(conn, groups, batch)
            c, w = (backend_cpu_ns(pid) - c0) / 1000 / pops, (time.perf_counter() - w0) * 1e6 / pops
            cpu[arm].append(c)
            wall[arm].append(w)
            print(f"round {r} {arm:<5} {ngroups} groups x {pops}: pg {c:8.1f} us, wall {w:8.1f} us per {ngroups} "
                  f"claims ({rows} segment rows in the round)")  # fmt: skip
    await conn.close()
    for arm in arms:
        print(f"{arm:<5} median per {ngroups} claims: pg {statistics.median(cpu[arm]):.0f} us, "
              f"wall {statistics.median(wall[arm]):.0f} us")  # fmt: skip
    print(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sql_pop_many", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pops", type=int, default=100, help="ten-group claims per arm per round")
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="queen-sqlpopmany-"))
    tmp.chmod(0o711)
    pg = EmbeddedPostgres(data_dir=tmp / "data", port=free_port(), fast=True)
    try:
        pg.start()
        asyncio.run(bench(pg, args.rounds, args.pops, args.groups, args.batch))
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
