"""PostgreSQL CPU per ``queen.pop_v1`` call (and per ``queen.ack_v3`` of what it leased), A/B.

Starts an embedded PostgreSQL (test-fixture fast mode), one database per SQL tree (``--base DIR``: an
older commit's ``sql/`` exported, e.g. ``git archive main sql | tar -x -C /tmp/main``; the worktree's
own ``sql/`` is always "new"), fills one queue per shape with 10 partitions of 100-message segments
(the benchmark's pushes), then pops in alternating rounds (base, new, base, new, ...) on one
connection and acks each lease (one ack_v3 with the lease book's hint) on another. The backends' CPU
comes from /proc/<pid>/schedstat. Also prints log_consumers' updates and HOT updates per tree.

Shapes: ``q100`` queue mode batch 100 (no partition named), ``g100`` one consumer group batch 100,
``q1`` queue mode batch 1, ``q1a`` the same with autoAck (benchmarks' pop_latency).
Usage: ``python -m benchmarks.sql_pop [--base DIR] [--rounds 3] [--pops 300] [--shapes q100,g100,q1,q1a]``.

``--many N`` (pop fusion, queen_pg/engine/fusion.py) compares instead, on the worktree's ``sql/``, N
groups' claims made as N ``queen.pop_v1`` calls one after the other (N woken long polls unfused) with
one ``queen.pop_many_v1`` call for the N (other groups, so each arm reads the queue from its start):
autoAck, 100 messages per claim, ``--pops`` N-group claims per arm and round; the backend's CPU and the
client's wall time per N claims.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path

import asyncpg

from benchmarks.broker import print_load, scratch_postgres
from benchmarks.sql_push import PAYLOAD, backend_cpu_ns
from queen_pg.db.apply import apply_sql
from queen_pg.embedded_pg import EmbeddedPostgres
from queen_pg.engine import calls, codec
from queen_pg.engine.ack_pack import Packed
from queen_pg.engine.leases import LeaseBook
from queen_pg.engine.pop import QUEUE_MODE
from queen_pg.engine.push import NewMessage, prepare

SHAPES = {
    "q100": (QUEUE_MODE, 100, False),
    "g100": ("g1", 100, False),
    "q1": (QUEUE_MODE, 1, False),
    "q1a": (QUEUE_MODE, 1, True),
}


async def _fill(conn: asyncpg.Connection, queue: str, segments: int) -> None:
    stmt = await conn.prepare(calls.PUSH)
    for s in range(segments):
        items = [NewMessage(queue, f"p{s % 10}", PAYLOAD, f"{queue}-{s}-{i}", None) for i in range(100)]
        await stmt.fetchrow("default", *prepare(items).args_v3(), [False])


async def _pops(
    popc: asyncpg.Connection, ackc: asyncpg.Connection, queue: str, shape: str, n: int
) -> tuple[int, int, int]:
    group, batch, auto_ack = SHAPES[shape]
    pop_pid = await popc.fetchval("SELECT pg_backend_pid()")
    ack_pid = await ackc.fetchval("SELECT pg_backend_pid()")
    pop_ns = ack_ns = 0
    done = 0
    for _ in range(n):
        lease = uuid.uuid4()
        t0 = backend_cpu_ns(pop_pid)
        rows = await popc.fetch(calls.POP, "default", queue, None, None, None, group, batch, 1, lease, auto_ack,
                                "all", None, None)  # fmt: skip
        pop_ns += backend_cpu_ns(pop_pid) - t0
        if not rows:
            break
        done += 1
        if auto_ack:
            continue
        pack = Packed()
        for row in rows:
            lo, hi = max(row["lease_start"], row["base_offset"]), min(row["lease_end"], row["end_offset"])
            for k, fr in enumerate(codec.unpack(row["payload"], row["codec"])):
                if lo <= row["base_offset"] + k < hi:
                    pack.add(row["partition_id"], fr.transaction_id, lease, group, "completed", None)
        book = LeaseBook()
        book.remember(lease, rows)
        t0 = backend_cpu_ns(ack_pid)
        res = await ackc.fetch(calls.ACK, "default", *pack.args(), pack.hint(book))
        ack_ns += backend_cpu_ns(ack_pid) - t0
        assert not res[0]["o_refused"], res
    return done, pop_ns, ack_ns


async def bench(pg: EmbeddedPostgres, trees: dict[str, Path | None], shapes: list[str], rounds: int, pops: int) -> None:
    admin = await asyncpg.connect(pg.admin_dsn())
    dsns: dict[str, str] = {}
    for name, root in trees.items():
        await admin.execute(f"CREATE DATABASE sqlpop_{name}")
        dsn = pg.admin_dsn(f"sqlpop_{name}")
        dsns[name] = dsn
        conn = await asyncpg.connect(dsn)
        await apply_sql(conn, root)
        for shape in shapes:
            per = SHAPES[shape][1]
            await _fill(conn, f"q-{shape}", max(10, (rounds * pops * per + 99) // 100 + 10))
        await conn.close()
    await admin.close()
    conns = {n: (await asyncpg.connect(d), await asyncpg.connect(d)) for n, d in dsns.items()}
    tot: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for shape in shapes:
            for name, (popc, ackc) in conns.items():
                done, pop_ns, ack_ns = await _pops(popc, ackc, f"q-{shape}", shape, pops)
                pu, au = pop_ns / 1000 / max(done, 1), ack_ns / 1000 / max(done, 1)
                tot.setdefault((shape, name), []).append(pu)
                print(f"round {r} {shape:<5} {name:<5} pops {done:>5}  pg pop {pu:7.1f} us/call  ack {au:7.1f} us/call")
    for popc, ackc in conns.values():
        await popc.execute("SELECT pg_stat_force_next_flush()")
        await ackc.execute("SELECT pg_stat_force_next_flush()")
        await popc.close()
        await ackc.close()
    for name, d in dsns.items():
        c = await asyncpg.connect(d)
        row = await c.fetchrow("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                               "WHERE schemaname = 'queen' AND relname = 'log_consumers'")  # fmt: skip
        await c.close()
        print(f"{name:<5} log_consumers updates {row['n_tup_upd']} HOT {row['n_tup_hot_upd']}")
    for (shape, name), v in sorted(tot.items()):
        print(f"{shape:<5} {name:<5} pop us/call per round: {' '.join(f'{x:.0f}' for x in v)}")
    print_load()


async def _alone(conn: asyncpg.Connection, groups: list[str], batch: int) -> int:
    rows = 0
    for g in groups:
        got = await conn.fetch(calls.POP, "default", "fan", None, None, None, g, batch, 1, uuid.uuid4(), True,
                               "all", None, None)  # fmt: skip
        rows += len(got)
    return rows


async def _fused(conn: asyncpg.Connection, groups: list[str], batch: int) -> int:
    n = len(groups)
    got = await conn.fetch(calls.POP_MANY, "default", "fan", [None] * n, groups, [batch] * n, [1] * n,
                           [uuid.uuid4() for _ in groups], [True] * n, ["all"] * n, [None] * n, [None] * n)  # fmt: skip
    return len(got)


async def bench_many(pg: EmbeddedPostgres, rounds: int, pops: int, ngroups: int, batch: int = 100) -> None:
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
    print_load()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sql_pop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, default=None, help="a sql/ tree to compare with (database 'base')")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pops", type=int, default=300, help="pops per shape per round")
    ap.add_argument("--shapes", default="q100,g100,q1,q1a")
    ap.add_argument(
        "--many", type=int, default=0, help="instead: N groups' claims, N pop_v1 calls against one pop_many_v1"
    )
    args = ap.parse_args(argv)
    trees: dict[str, Path | None] = {}
    if args.base is not None:
        trees["base"] = args.base
    trees["new"] = None
    with scratch_postgres("queen-sqlpop-") as pg:
        if args.many:
            asyncio.run(bench_many(pg, args.rounds, args.pops, args.many))
        else:
            asyncio.run(bench(pg, trees, args.shapes.split(","), args.rounds, args.pops))


if __name__ == "__main__":
    main()
