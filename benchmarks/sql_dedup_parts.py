"""The dedup table ``log_txns`` partitioned by day against the plain table at 10 M rows (docs/benchmarks.md).

The measurement docs/benchmarks.md#dedup-index left open.

Two embedded PostgreSQL servers (``benchmarks.sql_push.servers``). A keeps sql/schema.sql's ``log_txns``:
btree key (partition_id, txn_hash, msg_offset), BRIN on created_at. B makes it ``PARTITION BY RANGE
(created_at)``, one partition per day, the key gaining created_at (a partitioned table's key must hold
the partition key), the same BRIN. Both get the same ``--rows`` rows spread evenly over the 7 days
before B's current day partition began and the 12 hours since (so that partition holds half a day:
its mean over a day), in ``--spread`` queue partitions, the first of them the one the pushes go to.
Keys are built after the load, then both tables are VACUUM ANALYZEd and checkpointed, as autovacuum
and the checkpointer would leave them.

Then ``--rounds`` rounds, each: sql_push's paired A/B of its case ``a`` (100 items per call into that
queue partition, calls alternating between the servers, each call's backend CPU measured alone, WAL
bytes per message), and a paired A/B of a batch ack's resolution statement (queen.ack_v1's usual batch:
100 hashes of stored messages of that partition to their offsets; it has no time bound, so on B it
reads every day partition). Last, one retention pass per side on the oldest day: on A the range DELETE
of its rows (through the BRIN index) and the VACUUM that delete leaves; on B DETACH + DROP of its
partition. Their wall times and WAL bytes.

    python -m benchmarks.sql_dedup_parts [--rows N] [--spread P] [--rounds R] [--fsync] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.machine import loadavg, result_path
from benchmarks.sql_push import CASES, backend_cpu_ns, bench_ab, servers
from queen_pg.db.apply import apply_sql

DAYS = 7  # whole day partitions before the current one
OPEN_HOURS = 12  # the current day partition began this long ago
ACK_ITEMS = 100
# queen.ack_v1's resolution of a usual batch (sql/procedures/040_ack.sql), with its parameters
ACK_RESOLVE_SQL = (
    "SELECT count(*), max(m.off) FROM (SELECT min(t.msg_offset) AS off FROM queen.log_txns t"
    " WHERE t.partition_id = $1 AND t.txn_hash = ANY ($2::uuid[]) AND t.msg_offset >= $3 GROUP BY t.txn_hash) m"
)
WAL_LSN = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
PUSH_FILE = Path(__file__).resolve().parent.parent / "sql" / "procedures" / "020_push.sql"
# --bound-b: push_v3's newest-row lookups of its one-item and duplicate paths (no time bound today) also
# bounded by the dedup window, so that B's plans read the day partitions inside it only. The same
# verdicts: created_at never goes backwards within a partition, so the newest row of a hash is inside
# the window exactly when some row of it is.
BOUNDS = (
    (
        "WHERE lt.partition_id = v_pid AND lt.txn_hash = v_hash1\n",
        "WHERE lt.partition_id = v_pid AND lt.txn_hash = v_hash1"
        " AND lt.created_at > v_ts - make_interval(secs => q.dedup_window_seconds)\n",
    ),
    (
        "WHERE lt.partition_id = v_pid AND lt.txn_hash = ANY (v_hash)\n                             ORDER BY",
        "WHERE lt.partition_id = v_pid AND lt.txn_hash = ANY (v_hash)"
        " AND lt.created_at > v_ts - make_interval(secs => v_win)\n                             ORDER BY",
    ),
)


def bounded_push_sql() -> str:
    """020_push.sql with BOUNDS applied (each found exactly once)."""
    sql = PUSH_FILE.read_text()
    for old, new in BOUNDS:
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new)
    return sql


def plain_sql() -> str:
    """Side A, before the load: schema.sql's table without its indexes (built after it)."""
    return "ALTER TABLE queen.log_txns DROP CONSTRAINT log_txns_pkey; DROP INDEX queen.log_txns_created_brin;"


def partitioned_sql(base: datetime) -> str:
    """Side B, before the load: log_txns (still empty) made partitioned by day, partition d0 the oldest,
    d{DAYS} the current one (from ``base``), one more after it; no indexes yet."""
    return f"""
    DROP TABLE queen.log_txns;
    CREATE TABLE queen.log_txns (
        partition_id bigint NOT NULL,
        txn_hash     uuid NOT NULL,
        msg_offset   bigint NOT NULL,
        message_id   uuid NOT NULL,
        created_at   timestamptz NOT NULL
    ) PARTITION BY RANGE (created_at);
    DO $$
    DECLARE
        base timestamptz := '{base.isoformat()}';
    BEGIN
        FOR d IN -{DAYS}..1 LOOP
            EXECUTE format('CREATE TABLE queen.log_txns_d%s PARTITION OF queen.log_txns FOR VALUES FROM (%L) TO (%L)',
                           d + {DAYS}, base + make_interval(days => d), base + make_interval(days => d + 1));
        END LOOP;
    END $$;
    """


def prefill_sql(rows: int, spread: int, base: datetime) -> str:
    """The same rows on both sides: row i in queue partition 1 + i % spread at offset i / spread, its
    hash md5('prefill-' || i), stamped evenly from ``DAYS`` days before ``base`` up to now."""
    return f"""
    INSERT INTO queen.log_txns (partition_id, txn_hash, msg_offset, message_id, created_at)
    SELECT 1 + i % {spread}, md5('prefill-' || i)::uuid, i / {spread}, md5('msg-' || i)::uuid,
           b.t0 + (now() - b.t0) * (i::float8 / {rows})
      FROM generate_series(0, {rows} - 1) AS i,
           (SELECT timestamptz '{base.isoformat()}' - interval '{DAYS} days' AS t0) AS b
    """


def keys_sql(partitioned: bool) -> str:
    key = "partition_id, txn_hash, msg_offset, created_at" if partitioned else "partition_id, txn_hash, msg_offset"
    return (
        f"ALTER TABLE queen.log_txns ADD CONSTRAINT log_txns_pkey PRIMARY KEY ({key});"
        " CREATE INDEX log_txns_created_brin ON queen.log_txns USING brin (created_at);"
    )


def prefill_hash(i: int) -> uuid.UUID:
    return uuid.UUID(hashlib.md5(f"prefill-{i}".encode()).hexdigest())


async def prepare_side(dsn: str, partitioned: bool, rows: int, spread: int, base: datetime) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        await apply_sql(conn)
        await conn.execute(partitioned_sql(base) if partitioned else plain_sql())
        t0 = time.perf_counter()
        await conn.execute(prefill_sql(rows, spread, base))
        await conn.execute("SET maintenance_work_mem = '512MB'")
        await conn.execute(keys_sql(partitioned))
        await conn.execute("VACUUM ANALYZE queen.log_txns")
        await conn.execute("CHECKPOINT")
        sizes = await conn.fetch(
            "SELECT c.relname, pg_relation_size(c.oid) AS bytes FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'queen' AND c.relname LIKE 'log_txns%' AND c.relkind IN ('r', 'i') ORDER BY 1"
        )
        return {"load_seconds": round(time.perf_counter() - t0, 1), "bytes": {r["relname"]: r["bytes"] for r in sizes}}
    finally:
        await conn.close()


async def ack_ab(dsns: tuple[str, str], rows: int, spread: int, calls: int, warmup: int) -> dict[str, Any]:
    """Paired A/B of ACK_RESOLVE_SQL: each call resolves the next 100 stored messages of queue partition
    1, newest first (an ack follows its pop), alternating A B, B A; every hash must resolve on both."""
    conns = [await asyncpg.connect(d) for d in dsns]
    try:
        pids = [await c.fetchval("SELECT pg_backend_pid()") for c in conns]
        for c in conns:  # as in queen.ack_v1 (SET plan_cache_mode = force_generic_plan)
            await c.execute("SET plan_cache_mode = force_generic_plan")
        stmts = [await c.prepare(ACK_RESOLVE_SQL) for c in conns]
        newest = (rows - 1) // spread  # the highest offset of queue partition 1
        cpu = [0, 0]
        for call in range(warmup + calls):
            offs = [newest - call * ACK_ITEMS - k for k in range(ACK_ITEMS)]
            hashes = [prefill_hash(o * spread) for o in offs]
            for k in (0, 1) if call % 2 == 0 else (1, 0):
                t0 = backend_cpu_ns(pids[k])
                row = await stmts[k].fetchrow(1, hashes, 0)
                if call >= warmup:
                    cpu[k] += backend_cpu_ns(pids[k]) - t0
                assert row is not None and row[0] == ACK_ITEMS and row[1] == offs[0], (k, row)
    finally:
        for c in conns:
            await c.close()
    per = [round(cpu[k] / 1000 / calls / ACK_ITEMS, 2) for k in (0, 1)]
    return {
        "calls": calls,
        "a_pg_cpu_us_per_hash": per[0],
        "b_pg_cpu_us_per_hash": per[1],
        "b_over_a": round(cpu[1] / cpu[0], 3),
    }


async def timed(conn: asyncpg.Connection, *statements: str) -> dict[str, Any]:
    wal0 = await conn.fetchval(WAL_LSN)
    t0 = time.perf_counter()
    for sql in statements:
        await conn.execute(sql)
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "wal_bytes": int(await conn.fetchval(WAL_LSN) - wal0)}


async def retention(dsns: tuple[str, str], base: datetime) -> dict[str, Any]:
    """One retention pass per side on the oldest day: A's range DELETE then its VACUUM; B's DETACH + DROP."""
    cut = (base - timedelta(days=DAYS - 1)).isoformat()
    a = await asyncpg.connect(dsns[0])
    b = await asyncpg.connect(dsns[1])
    try:
        day_rows = await b.fetchval("SELECT count(*) FROM queen.log_txns_d0")
        plan = await a.fetch(f"EXPLAIN DELETE FROM queen.log_txns WHERE created_at < '{cut}'")
        delete = await timed(a, f"DELETE FROM queen.log_txns WHERE created_at < '{cut}'")
        vacuum = await timed(a, "VACUUM queen.log_txns")
        drop = await timed(
            b, "ALTER TABLE queen.log_txns DETACH PARTITION queen.log_txns_d0", "DROP TABLE queen.log_txns_d0"
        )
        left = [await c.fetchval("SELECT count(*) FROM queen.log_txns") for c in (a, b)]
    finally:
        await a.close()
        await b.close()
    assert left[0] == left[1], left
    return {
        "day_rows": day_rows,
        "rows_left": left[0],
        "a_delete": delete,
        "a_vacuum": vacuum,
        "a_delete_plan": [r[0] for r in plan],
        "b_detach_drop": drop,
    }


def spread_of(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


async def measure(dsns: tuple[str, str], args: argparse.Namespace) -> dict[str, Any]:
    now = datetime.now(UTC)
    base = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=OPEN_HOURS)
    sides = await asyncio.gather(*(prepare_side(dsns[k], k == 1, args.rows, args.spread, base) for k in (0, 1)))
    rounds: list[dict[str, Any]] = []
    for r in range(1, args.rounds + 1):
        b_push = bounded_push_sql() if args.bound_b else None
        rows = await bench_ab(dsns, ((None, []), (b_push, [])), args.cases, args.calls, args.warmup, run=r)
        ack = await ack_ab(dsns, args.rows, args.spread, args.ack_calls, 10)
        push = dict(zip(args.cases, rows, strict=True))
        rounds.append({"round": r, "load1": loadavg()[0], "push": push, "ack": ack})
        for key, x in push.items():
            print(
                f"round {r} push {key}: A {x['a_pg_cpu_us_per_msg']:.2f} B {x['b_pg_cpu_us_per_msg']:.2f} us/msg"
                f" (B/A {x['b_over_a']:.3f}), wal A {x['a_wal_bytes_per_msg']} B {x['b_wal_bytes_per_msg']} B/msg"
            )
        print(
            f"round {r} ack: A {ack['a_pg_cpu_us_per_hash']:.2f} B {ack['b_pg_cpu_us_per_hash']:.2f} us/hash"
            f" (B/A {ack['b_over_a']:.3f}); load {loadavg()[0]}",
            flush=True,
        )
    conn = await asyncpg.connect(dsns[0])
    try:  # the pushes went to the pre-filled queue partitions (ids 1, 2, ... in the order of the cases)
        pushed = await conn.fetch(
            "SELECT q.name, p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id ORDER BY p.id"
        )
    finally:
        await conn.close()
    assert [r["id"] for r in pushed] == list(range(1, len(args.cases) + 1)), pushed
    ret = await retention(dsns, base)
    push_fields = (
        "a_pg_cpu_us_per_msg",
        "b_pg_cpu_us_per_msg",
        "b_over_a",
        "a_wal_bytes_per_msg",
        "b_wal_bytes_per_msg",
    )
    summary = {
        f"push_{key}_{field}": spread_of([x["push"][key][field] for x in rounds])
        for key in args.cases
        for field in push_fields
    }
    summary |= {
        f"ack_{field}": spread_of([x["ack"][field] for x in rounds])
        for field in ("a_pg_cpu_us_per_hash", "b_pg_cpu_us_per_hash", "b_over_a")
    }
    return {
        "rows": args.rows,
        "cases": {key: CASES[key].name for key in args.cases},
        "spread": args.spread,
        "fsync": args.fsync,
        "bound_b": args.bound_b,
        "base": base.isoformat(),
        "prefill": {"a": sides[0], "b": sides[1]},
        "rounds": rounds,
        "summary": summary,
        "retention": ret,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sql_dedup_parts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="log_txns rows pre-filled per side (default 10 M)")
    ap.add_argument("--spread", type=int, default=1, help="queue partitions the rows are spread over (default 1)")
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds (default 6)")
    ap.add_argument("--cases", default="a", help="sql_push cases measured each round (default a: 100 items)")
    ap.add_argument("--calls", type=int, default=300, help="measured push calls per side per round (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="unmeasured push calls first, per round (default 30)")
    ap.add_argument("--ack-calls", type=int, default=200, help="measured ack resolutions per side per round")
    ap.add_argument("--bound-b", action="store_true", help="B's push lookups bounded by the dedup window (BOUNDS)")
    ap.add_argument("--fsync", action="store_true", help="keep fsync on (default: the test fixtures' fast mode)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here (default: benchmarks/results/)")
    args = ap.parse_args(argv)
    if bad := set(args.cases) - set(CASES):
        ap.error(f"unknown cases: {''.join(sorted(bad))}")
    with servers(2, args.fsync) as (dsn_a, dsn_b):
        res = asyncio.run(measure((dsn_a, dsn_b), args))
    for key, val in res["summary"].items():
        print(f"{key:<28} median {val['median']:>9} min {val['min']:>9} max {val['max']:>9}")
    print(json.dumps(res["retention"], indent=1))
    out = args.json or result_path("dedup")
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
