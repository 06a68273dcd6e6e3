"""Direct SQL micro-benchmark of ``queen.push_v3``: PostgreSQL CPU per pushed message, no broker, no HTTP.

Starts an embedded PostgreSQL in a temporary dir (as benchmarks/broker.py does), applies the schema, and
calls push_v3 over asyncpg exactly as queen_pg/engine/push.py does (the same ``prepare()``: realistic
zstd blob of QPF1 frames, xxh3 hashes, uuid7 message ids; the same SQL text). For each case it reports
the backend's CPU per message and per call (from /proc/<backend pid>/schedstat, ns resolution; read
through ``SELECT pg_backend_pid()``) and the wall time per call (median and p90). Each call is its own
transaction (autocommit), as in the broker.

Cases: ``a`` 1 call of 100 items to one (queue, partition); ``b`` 1 call of 1 item; ``c`` 1 call of
8 groups × 1 item; ``d`` 1 call of 8 items to one partition (fused 1-item requests); ``e`` as ``a`` with
every other item repeating a transactionId of the previous call (duplicates answered from log_txns);
``f`` 1 call of 32 groups × 1 item; ``g`` 1 call of 8 groups × 4 items (the general steps).

``--push-sql FILE`` applies another 020_push.sql over the schema (A/B against an older commit:
``git show REV:sql/procedures/020_push.sql > /tmp/old.sql``); ``--sql FILE`` applies any SQL after it
(e.g. the schema statements of an older revision). The WAL bytes per message (pg_current_wal_insert_lsn
before and after) come with the CPU. The figures are a lower bound on a shared
machine: the load average is printed with them.

    python -m benchmarks.sql_push [--cases abc] [--calls N] [--push-sql FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.broker import print_load, scratch_postgres
from queen_pg.db.apply import apply_sql
from queen_pg.engine.calls import PUSH
from queen_pg.engine.push import NewMessage, prepare

PAYLOAD = json.dumps(
    {
        "orderId": 123456,
        "customer": "c-0042",
        "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
        "total": 42.5,
        "note": "benchmark payload of a typical size",
    }
).encode()


@dataclass(frozen=True)
class Case:
    name: str
    groups: int  # distinct (queue, partition) per call
    per_group: int  # items per group
    calls: int  # default number of measured calls
    dups: bool = False  # every other item repeats a transactionId of the previous call


CASES = {
    "a": Case("a: 1 call x 100 items, 1 group", 1, 100, 300),
    "b": Case("b: 1 call x 1 item", 1, 1, 2000),
    "c": Case("c: 1 call x 8 groups x 1 item", 8, 1, 1000),
    "d": Case("d: 1 call x 8 items, 1 group", 1, 8, 1000),
    "e": Case("e: as a, half duplicates of the previous call", 1, 100, 300, dups=True),
    "f": Case("f: 1 call x 32 groups x 1 item", 32, 1, 300),
    "g": Case("g: 1 call x 8 groups x 4 items", 8, 4, 500),
}


def backend_cpu_ns(pid: int) -> int:
    """CPU time of a process so far in ns (/proc/<pid>/schedstat; /proc/<pid>/stat ticks as a fallback)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except OSError:
        with open(f"/proc/{pid}/stat", "rb") as fb:
            s = fb.read()
        fields = s[s.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def items_for(case: Case, tag: str, call: int, prev: list[str], run: int = 0) -> tuple[list[NewMessage], list[str]]:
    """One call's items; ``run`` > 0 gives the same queues new transactionIds (a repeated round)."""
    out: list[NewMessage] = []
    txns: list[str] = []
    for g in range(case.groups):
        for k in range(case.per_group):
            i = g * case.per_group + k
            fresh = f"{tag}-r{run}-{call}-{i}" if run else f"{tag}-{call}-{i}"
            txn = prev[i] if case.dups and prev and i % 2 == 1 else fresh
            txns.append(txn)
            out.append(NewMessage(f"q-{tag}-{g}", "p0", PAYLOAD, txn, None))
    return out, txns


async def run_case(conn: asyncpg.Connection, pid: int, key: str, case: Case, calls: int, warmup: int) -> dict[str, Any]:
    stmt = await conn.prepare(PUSH)
    prev: list[str] = []
    walls: list[float] = []
    cpu0 = 0
    wal0 = 0
    for call in range(warmup + calls):
        items, txns = items_for(case, key, call, prev)
        prev = txns
        args = prepare(items).args_v3()
        sealed = [False] * case.groups
        if call == warmup:
            wal0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            cpu0 = backend_cpu_ns(pid)
        t0 = time.perf_counter()
        row = await stmt.fetchrow("t", *args, sealed)
        walls.append(time.perf_counter() - t0)
        assert row is not None and len(row["partition_ids"]) == case.groups
    cpu = backend_cpu_ns(pid) - cpu0
    wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn") - wal0
    walls = sorted(walls[warmup:])
    n = case.groups * case.per_group
    return {
        "case": case.name,
        "calls": calls,
        "items_per_call": n,
        "pg_cpu_us_per_msg": round(cpu / 1000 / calls / n, 2),
        "pg_cpu_us_per_call": round(cpu / 1000 / calls, 1),
        "wal_bytes_per_msg": round(float(wal) / calls / n, 1),
        "wall_us_per_call_p50": round(statistics.median(walls) * 1e6, 1),
        "wall_us_per_call_p90": round(walls[int(len(walls) * 0.9)] * 1e6, 1),
    }


async def bench(
    dsn: str, push_sql: str | None, cases: str, calls: int | None, warmup: int, extra: list[str] | None = None
) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        await apply_sql(conn)
        if push_sql is not None:
            await conn.execute(push_sql)
        for sql in extra or []:
            await conn.execute(sql)
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        return [await run_case(conn, pid, k, CASES[k], calls or CASES[k].calls, warmup) for k in cases]
    finally:
        await conn.close()


async def _side(dsn: str, push_sql: str | None, extra: list[str]) -> tuple[asyncpg.Connection, int]:
    conn = await asyncpg.connect(dsn)
    await apply_sql(conn)
    if push_sql is not None:
        await conn.execute(push_sql)
    for sql in extra:
        await conn.execute(sql)
    return conn, await conn.fetchval("SELECT pg_backend_pid()")


async def bench_ab(
    dsns: tuple[str, str],
    sides: tuple[tuple[str | None, list[str]], tuple[str | None, list[str]]],
    cases: str,
    calls: int | None,
    warmup: int,
    checkpoint_every: int = 0,
    run: int = 0,
) -> list[dict[str, Any]]:
    """Paired A/B: two servers, calls alternating between them (A B, B A, ...) in the same minutes, each
    call's backend CPU measured alone: machine load hits both sides alike. ``run``: as items_for's."""
    ab = [await _side(dsns[k], *sides[k]) for k in (0, 1)]
    out: list[dict[str, Any]] = []
    try:
        for key in cases:
            case = CASES[key]
            n = case.groups * case.per_group
            stmts = [await c.prepare(PUSH) for c, _ in ab]
            prev: list[list[str]] = [[], []]
            cpu = [0, 0]
            wal0 = [0, 0]
            for call in range(warmup + (calls or case.calls)):
                if call == warmup:
                    wal0 = [await c.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn") for c, _ in ab]
                if checkpoint_every and call >= warmup and (call - warmup) % checkpoint_every == 0:
                    for c, _ in ab:  # the checkpointer's work, not the backend's: full-page writes follow
                        await c.execute("CHECKPOINT")
                for k in (0, 1) if call % 2 == 0 else (1, 0):
                    items, prev[k] = items_for(case, key, call, prev[k], run)
                    args = prepare(items).args_v3()
                    t0 = backend_cpu_ns(ab[k][1])
                    await stmts[k].fetchrow("t", *args, [False] * case.groups)
                    if call >= warmup:
                        cpu[k] += backend_cpu_ns(ab[k][1]) - t0
            m = calls or case.calls
            wal = [await c.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn") for c, _ in ab]
            wal = [wal[k] - wal0[k] for k in (0, 1)]
            row: dict[str, Any] = {"case": case.name, "calls": m, "items_per_call": n}
            for k, side in ((0, "a"), (1, "b")):
                row[f"{side}_pg_cpu_us_per_msg"] = round(cpu[k] / 1000 / m / n, 2)
                row[f"{side}_wal_bytes_per_msg"] = round(float(wal[k]) / m / n, 1)
            row["b_over_a"] = round(cpu[1] / cpu[0], 3)
            out.append(row)
    finally:
        for c, _ in ab:
            await c.close()
    return out


@contextmanager
def servers(count: int, fsync: bool) -> Iterator[list[str]]:
    """``count`` embedded PostgreSQL servers in temporary dirs, their admin DSNs; removed afterwards."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(scratch_postgres("queen-sqlpush-", fast=not fsync)).admin_dsn() for _ in range(count)
        ]


def report(results: list[dict[str, Any]], row: Callable[[dict[str, Any]], str], out: Path | None) -> None:
    """One printed line per case, the load average, and (``--json``) the file {"load1", "results"}."""
    for r in results:
        print(row(r))
    load = print_load()
    if out is not None:
        out.write_text(json.dumps({"load1": load, "results": results}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sql_push", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="abc", help="which cases to run, in order (letters of abcdefg; default abc)")
    ap.add_argument("--calls", type=int, default=None, help="measured calls per case (default: per case, 300-2000)")
    ap.add_argument("--warmup", type=int, default=50, help="unmeasured calls first (plans, caches; default 50)")
    ap.add_argument("--push-sql", type=Path, default=None, help="apply this 020_push.sql over the schema (A/B)")
    ap.add_argument("--sql", type=Path, action="append", default=[], help="also apply this SQL file (repeatable; A/B)")
    ap.add_argument("--b-push-sql", type=Path, default=None, help="paired A/B: side B's 020_push.sql")
    ap.add_argument("--b-sql", type=Path, action="append", default=None, help="paired A/B: side B's extra SQL")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="paired A/B: a CHECKPOINT on both sides every N measured calls (full-page writes)",
    )
    ap.add_argument("--fsync", action="store_true", help="keep fsync on (default: the test fixtures' fast mode)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if bad := set(args.cases) - set(CASES):
        ap.error(f"unknown cases: {''.join(sorted(bad))}")
    push_sql = args.push_sql.read_text() if args.push_sql is not None else None
    if args.b_push_sql is not None or args.b_sql is not None:
        main_ab(args, push_sql)
        return
    with servers(1, args.fsync) as (dsn,):
        results = asyncio.run(
            bench(dsn, push_sql, args.cases, args.calls, args.warmup, [f.read_text() for f in args.sql])
        )
    report(
        results,
        lambda r: (
            f"{r['case']:<48} pg {r['pg_cpu_us_per_msg']:>8.2f} us/msg {r['pg_cpu_us_per_call']:>8.1f} us/call"
            f"   wal {r['wal_bytes_per_msg']:>7.1f} B/msg"
            f"   wall p50 {r['wall_us_per_call_p50']:>8.1f} p90 {r['wall_us_per_call_p90']:>8.1f} us/call"
        ),
        args.json,
    )


def main_ab(args: argparse.Namespace, push_sql: str | None) -> None:
    b_push = args.b_push_sql.read_text() if args.b_push_sql is not None else None
    sides = ((push_sql, [f.read_text() for f in args.sql]), (b_push, [f.read_text() for f in args.b_sql or []]))
    with servers(2, args.fsync) as (dsn_a, dsn_b):
        results = asyncio.run(
            bench_ab((dsn_a, dsn_b), sides, args.cases, args.calls, args.warmup, args.checkpoint_every)
        )
    report(
        results,
        lambda r: (
            f"{r['case']:<48} A {r['a_pg_cpu_us_per_msg']:>8.2f} B {r['b_pg_cpu_us_per_msg']:>8.2f} us/msg"
            f"  B/A {r['b_over_a']:.3f}   wal A {r['a_wal_bytes_per_msg']:>7.1f}"
            f" B {r['b_wal_bytes_per_msg']:>7.1f} B/msg"
        ),
        args.json,
    )


if __name__ == "__main__":
    main()
