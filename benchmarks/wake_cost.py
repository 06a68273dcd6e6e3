"""What blocking costs on this machine: the CPU a process pays each time it sleeps and is woken.

A lone request makes the broker block twice (waiting for the request, then for PostgreSQL's answer)
and PostgreSQL at least once; a loaded broker always has work and never blocks. This prints:

* ``python``: the same small piece of Python work (``WORK``) run back to back, and with a sleep of
  50 µs, 300 µs or 1 ms after each run: the CPU per run (``time.process_time``), so the difference is
  what one sleep/wake cycle adds (the scheduler, and the caches and TLB the process finds cold);
* ``asyncpg``: one connection (uvloop, as the broker) running ``SELECT 1`` (answered before the client
  blocks) and ``SELECT pg_sleep(0.0003)`` (the client blocks, as it does during a push): the client's
  CPU per query, and the backend's (``/proc/<pid>/schedstat``).

A lower bound on a shared machine: the load average is printed with the figures.

    python -m benchmarks.wake_cost [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks.broker import print_load, scratch_postgres


def work() -> int:
    d = {i: str(i) for i in range(200)}
    return sum(len(v) for v in d.values())


def python_cycles(n: int) -> None:
    for pause in (0.0, 0.00005, 0.0003, 0.001):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            work()
            if pause:
                time.sleep(pause)
        c1, w1 = time.process_time(), time.perf_counter()
        label = "back to back" if not pause else f"sleep {pause * 1e6:.0f} us after each"
        print(f"python  {label:<28} cpu {(c1 - c0) / n * 1e6:7.1f} us/run   wall {(w1 - w0) / n * 1e6:8.1f} us/run")


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


async def asyncpg_cycles(dsn: str, n: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        for sql in ("SELECT 1", "SELECT pg_sleep(0.0003)"):
            for _ in range(100):
                await conn.fetchval(sql)
            c0, p0, w0 = time.process_time(), backend_cpu(pid), time.perf_counter()
            for _ in range(n):
                await conn.fetchval(sql)
            c1, p1, w1 = time.process_time(), backend_cpu(pid), time.perf_counter()
            print(
                f"asyncpg {sql:<28} cpu {(c1 - c0) / n * 1e6:7.1f} us/query (backend {(p1 - p0) / n * 1e6:6.1f})"
                f"   wall {(w1 - w0) / n * 1e6:8.1f} us/query"
            )
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.wake_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="runs (and queries) per case (default 2000)")
    args = ap.parse_args(argv)
    python_cycles(args.runs)
    with scratch_postgres("queen-wake-") as pg:
        import uvloop

        uvloop.install()
        asyncio.run(asyncpg_cycles(pg.admin_dsn(), args.runs))
    print_load()


if __name__ == "__main__":
    main()
