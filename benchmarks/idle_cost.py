"""What an idle broker costs: CPU and wake-ups per second of each process of ``queen-pg serve``.

Starts ``queen-pg serve --workers N`` on an embedded PostgreSQL of its own (``BrokerProcess``),
lets it settle (``--warmup``), then reads, at the start and at the end of a window (``--window``,
20 s by default) with no request in flight, for every process of its tree and every thread of it:

- ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on CPU), summed per process;
- ``/proc/<pid>/task/<tid>/status`` ``voluntary_ctxt_switches`` (each one a sleep, i.e. a wake-up
  after it) and ``nonvoluntary_ctxt_switches``, summed per process.

Roles: ``supervisor`` (the serve process, uvicorn's process supervisor), ``worker`` (each uvicorn
worker), ``pg-backend`` (a PostgreSQL backend serving a client connection), ``pg-other`` (the
postmaster and its auxiliary processes: checkpointer, walwriter, autovacuum, ...). Prints a table
per process and per role, and writes JSON (``--output``). Run it twice (e.g. on two commits, or
with ``--env QUEEN_X=...``) in the same minutes to compare; the machine may be shared, but the
idle figures are per process, so other load moves them little (it shows in ``load``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.broker import BrokerProcess
from benchmarks.machine import machine_info
from benchmarks.procstat import _all_stats, _tree


@dataclass(slots=True)
class Sample:
    cpu_ns: int
    voluntary: int
    involuntary: int
    threads: int


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def sample(pid: int) -> Sample | None:
    """The process's CPU ns and context switches so far, summed over its threads; None if gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    cpu = vol = invol = 0
    for tid in tids:
        sched = _read(f"/proc/{pid}/task/{tid}/schedstat")
        status = _read(f"/proc/{pid}/task/{tid}/status")
        if sched is None or status is None:
            continue  # a thread that ended meanwhile
        cpu += int(sched.split()[0])
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
    return Sample(cpu, vol, invol, len(tids))


def role(pid: int, root: int, comm: str, ppid_comm: str) -> str:
    if pid == root:
        return "supervisor"
    if comm.startswith("postgres"):
        cmd = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
        return "pg-backend" if ("(" in cmd and ")" in cmd) or "[local]" in cmd else "pg-other"
    return "worker" if not ppid_comm.startswith("postgres") else "other"


def describe(pid: int) -> str:
    cmd = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
    return cmd[:90]


def measure(root: int, window: float) -> dict[str, Any]:
    stats = _all_stats()
    pids = _tree(root, stats)
    before = {p: s for p in pids if (s := sample(p)) is not None}
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    time.sleep(window)
    elapsed = time.monotonic() - t0
    after = {p: s for p in before if (s := sample(p)) is not None}
    procs: list[dict[str, Any]] = []
    for pid, b in before.items():
        a = after.get(pid)
        if a is None:
            continue
        ppid, comm, _ = stats[pid]
        procs.append(
            {
                "pid": pid,
                "role": role(pid, root, comm, stats.get(ppid, (0, "", 0))[1]),
                "cmd": describe(pid),
                "threads": a.threads,
                "cpu_ms_per_s": (a.cpu_ns - b.cpu_ns) / 1e6 / elapsed,
                "wakeups_per_s": (a.voluntary - b.voluntary) / elapsed,
                "preempted_per_s": (a.involuntary - b.involuntary) / elapsed,
            }
        )
    roles: dict[str, dict[str, float]] = {}
    for p in procs:
        r = roles.setdefault(p["role"], {"processes": 0, "cpu_ms_per_s": 0.0, "wakeups_per_s": 0.0})
        r["processes"] += 1
        r["cpu_ms_per_s"] += p["cpu_ms_per_s"]
        r["wakeups_per_s"] += p["wakeups_per_s"]
    total = sum(p["cpu_ms_per_s"] for p in procs)
    return {
        "window_s": round(elapsed, 2),
        "load": [load0, os.getloadavg()[0]],
        "total_cpu_ms_per_s": total,
        "roles": roles,
        "processes": procs,
    }


def print_report(result: dict[str, Any]) -> None:
    print(f"window {result['window_s']} s, load {result['load'][0]:.1f} -> {result['load'][1]:.1f}")
    print(f"{'pid':>8} {'role':<11} {'thr':>3} {'cpu ms/s':>9} {'wakes/s':>8}  cmd")
    for p in sorted(result["processes"], key=lambda p: (p["role"], -p["cpu_ms_per_s"])):
        if p["cpu_ms_per_s"] < 0.005 and p["wakeups_per_s"] < 0.05:
            continue
        print(
            f"{p['pid']:>8} {p['role']:<11} {p['threads']:>3} {p['cpu_ms_per_s']:>9.2f} "
            f"{p['wakeups_per_s']:>8.1f}  {p['cmd'][:60]}"
        )
    print("per role:")
    for name, r in sorted(result["roles"].items()):
        cpu, wakes = r["cpu_ms_per_s"], r["wakeups_per_s"]
        print(f"  {name:<11} n={r['processes']:<3} cpu {cpu:7.2f} ms/s  wakes {wakes:6.1f}/s")
    print(f"tree total: {result['total_cpu_ms_per_s']:.2f} ms CPU per second")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.idle_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="uvicorn workers (default 2)")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured (default 20)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds after /health before measuring (default 10)")
    ap.add_argument("--runs", type=int, default=1, help="windows measured one after the other (default 1)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment for the broker")
    ap.add_argument("--output", type=Path, default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    runs: list[dict[str, Any]] = []
    with BrokerProcess(workers=args.workers, env=env) as broker:
        time.sleep(args.warmup)
        for _ in range(args.runs):
            result = measure(broker.pid, args.window)
            print_report(result)
            runs.append(result)
    out = {"machine": machine_info(), "workers": args.workers, "env": env, "runs": runs}
    if args.output is not None:
        args.output.write_text(json.dumps(out, indent=2, default=lambda o: asdict(o)) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
