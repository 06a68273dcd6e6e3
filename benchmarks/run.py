"""``make bench``: start a broker, run the scenarios, print a table, write a results file.

    python -m benchmarks.run [--scenarios a,b] [--runs 3] [--duration 5] [--broker-url URL] [--profile KEYS]

Each scenario runs ``--runs`` times (after a ``--warmup`` that is not counted) and its median is
compared with its target; the broker memory is read once, after the others. The load generator is a
separate process per run (``benchmarks/loadgen.py``). Missed targets are reported, not failures: the exit
code is 1 only when a scenario could not run (broker down, every request refused, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.broker import BenchError, BrokerProcess, wait_healthy
from benchmarks.machine import ROOT, loadavg, machine_info, postgres_info, result_path
from benchmarks.procstat import anon_mb, broker_processes, workers
from benchmarks.profiling import Profiler
from benchmarks.scenarios import BY_KEY, SCENARIOS, Context, Metric, Scenario

DEFAULT_OUTPUT = "benchmarks/results/<date>-<commit>.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queen-pg bench",
        description="Run the benchmark suite: start a broker (embedded PostgreSQL in a temporary dir) or use "
        "--broker-url, drive it over HTTP from a separate load-generator process, print a table and write "
        "a results file. Targets missed are reported, not errors.",
    )
    keys = ", ".join(s.key for s in SCENARIOS)
    p.add_argument("--scenarios", default="all", help=f"comma-separated scenario keys, or all [{keys}]")
    p.add_argument("--list", action="store_true", help="list the scenarios and their targets, and exit")
    p.add_argument("--runs", type=int, default=3, help="measured runs per scenario; the median is quoted [3]")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run [5]")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measured window [1]")
    p.add_argument("--output", type=Path, help=f"results file [{DEFAULT_OUTPUT}]")
    p.add_argument("--broker-url", help="use this running broker instead of starting one (e.g. http://host:6632)")
    p.add_argument("--broker-pid", type=int, help="with --broker-url: its pid, for CPU shares and memory")
    p.add_argument("--workers", type=int, help="passed to `queen-pg serve --workers` (started broker only)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the started broker, e.g. --env QUEEN_DB_POOL_SIZE=40 (repeatable)",
    )
    p.add_argument("--pop-prefill", type=int, default=100_000, help="messages pre-filled for pop and fan-out [100000]")
    p.add_argument(
        "--consume-wait-ms",
        type=int,
        default=2_000,
        help="consumers long-poll (wait=true) with this timeout, like the official client; 0 = the old "
        "wait=false + 2 ms sleep after an empty pop [2000]",
    )
    p.add_argument(
        "--profile",
        default="",
        help="comma-separated scenario keys (or all) to profile with py-spy in one extra, unquoted run; "
        "collapsed stacks go to --profile-dir, a summary to the results",
    )
    p.add_argument("--profile-dir", type=Path, default=ROOT / "benchmarks" / "profiles", help="py-spy output dir")
    return p


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit in ("msg/s", "req/s", "µs/req"):
        return f"{value:,.0f} {unit}"
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:.0f} %"
    return f"{value:,.2f} {unit}" if unit == "ms" else f"{value:,.1f} {unit}"


def judge(metric: Metric, median: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": metric.name,
        "unit": metric.unit,
        "median": median,
        "target": metric.target,
        "op": metric.op if metric.target is not None else None,
        "met": metric.met(median),
    }
    if out["met"] is False and median and metric.target:
        # how far off, as a share of the target: 60 % of a ≥ target reached, or 2.5× a ≤ target
        out["of_target"] = round(median / metric.target, 3)
    return out


def run_scenario(ctx: Context, sc: Scenario, runs: int, profile: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"key": sc.key, "title": sc.title, "target": sc.target_text, "runs": [], "error": None}
    n = 1 if sc.single_reading else runs
    try:
        if sc.setup is not None:
            t0 = time.monotonic()
            sc.setup(ctx)
            print(f"  [{sc.key}] set-up done in {time.monotonic() - t0:.1f} s", flush=True)
        for i in range(n):
            values, details = sc.run(ctx, i)
            row["runs"].append({"values": values, "cost": _cost(details), "details": details})
            print(f"  [{sc.key}] run {i + 1}/{n}: {_brief(sc, values, details)}", flush=True)
        if profile and not sc.single_reading:
            ctx.profiling = sc.key
            try:
                values, _details = sc.run(ctx, n)
            finally:
                ctx.profiling = None
            print(f"  [{sc.key}] profiled run: {_brief(sc, values, {})}", flush=True)
    except BenchError as exc:
        row["error"] = str(exc)
        print(f"  [{sc.key}] ERROR: {exc}", flush=True)
    finally:
        if sc.teardown is not None:
            try:
                sc.teardown(ctx)
            except OSError as exc:
                print(f"  [{sc.key}] teardown failed: {exc}", flush=True)
    metrics = []
    for m in sc.metrics:
        vals = [r["values"][m.name] for r in row["runs"] if m.name in r["values"]]
        vals = [v for v in vals if not math.isnan(v)]
        metrics.append(judge(m, statistics.median(vals) if vals else None))
    row["metrics"] = metrics
    judged = [m["met"] for m in metrics if m["met"] is not None]
    row["met"] = all(judged) if judged and not row["error"] else (False if row["error"] else None)
    return row


def _cpu(details: dict[str, Any]) -> dict[str, float]:
    for d in (details, *[v for v in details.values() if isinstance(v, dict)]):
        if "cpu_cores" in d:
            cpu: dict[str, float] = d["cpu_cores"]
            return cpu
    return {}


def _cost(details: dict[str, Any]) -> dict[str, float]:
    """CPU microseconds per message of each role, from the cores they used and the rate: a figure that
    stays meaningful when other work on the machine takes cores away."""
    cpu, rate = _cpu(details), details.get("rate") or 0
    if not rate:
        for d in details.values():
            if isinstance(d, dict) and d.get("rate"):
                cpu, rate = d.get("cpu_cores", {}), d["rate"]  # the last measured part (fan-out, 10k)
    return {f"{k}_us_per_msg": round(cpu[k] * 1e6 / rate, 1) for k in ("broker", "postgres") if k in cpu and rate}


def _brief(sc: Scenario, values: dict[str, float], details: dict[str, Any]) -> str:
    parts = [f"{m.name}={fmt(values.get(m.name), m.unit)}" for m in sc.metrics if m.name in values]
    cpu = _cpu(details)
    if cpu:
        parts.append("cores: " + " ".join(f"{k} {cpu[k]:.2f}" for k in ("broker", "postgres", "loadgen", "irq", "other")
                                          if k in cpu))  # fmt: skip
    lat = details.get("latency_ms")
    if lat and sc.key != "latency":
        parts.append(f"latency p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms")
    cost = _cost(details)
    if cost:
        parts.append("CPU µs/msg: " + " ".join(f"{k.split('_')[0]} {v:,.0f}" for k, v in cost.items()))
    errs = [d for d in (details, *details.values()) if isinstance(d, dict) and (d.get("errors") or d.get("rejected"))]
    for d in errs[:1]:
        parts.append(f"errors {d.get('errors')} rejected {d.get('rejected')} first: {d.get('first_error')}")
    return ", ".join(parts)


def _rss_after(pid: int | None) -> dict[str, float] | None:
    """Each broker worker's RSS and anonymous memory (MB) once a scenario is done: which scenario makes
    the memory grow (the ``memory`` scenario reads the end state only)."""
    if pid is None:
        return None
    ws = workers(broker_processes(pid))
    return {"rss_mb": round(max((w.rss_mb for w in ws), default=0.0), 1),
            "anon_mb": round(max((anon_mb(w.pid) for w in ws), default=0.0), 1)} if ws else None  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [("scenario", "target", "median", "met")]
    for row in rows:
        judged = [m for m in row["metrics"] if m["target"] is not None]
        shown = judged or row["metrics"][:2]  # a scenario without a target shows its first figures
        median = ", ".join(fmt(m["median"], m["unit"]) for m in shown) or "n/a"
        if row["error"]:
            met = "error"
        else:
            met = {True: "yes", False: "no", None: "-"}[row["met"]]
            shares = [f"{100 * m['of_target']:.0f} % of target" if m["op"] == ">=" else f"{m['of_target']:.1f}× target"
                      for m in judged if "of_target" in m]  # fmt: skip
            met += f" ({'; '.join(shares)})" if shares else ""
        n = len(row["runs"])
        lines.append((row["title"], row["target"], f"{median} ({n} run{'s' if n != 1 else ''})", met))
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.key:16} {s.title} — target {s.target_text}")
        return 0
    keys = [s.key for s in SCENARIOS] if args.scenarios == "all" else [k.strip() for k in args.scenarios.split(",")]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown or args.runs < 1 or args.duration <= 0 or args.warmup < 0 or any("=" not in e for e in args.env):
        print(f"queen-pg bench: unknown scenarios {unknown} or a bad --runs/--duration/--warmup/--env", file=sys.stderr)
        return 2
    profile_keys = set(keys if args.profile == "all" else filter(None, args.profile.split(",")))
    selected = [BY_KEY[k] for k in keys]
    selected.sort(key=lambda s: s.single_reading)  # memory last: after the load
    started = time.monotonic()
    output = args.output or result_path()  # named when the run starts: its date, the commit it measures
    results: dict[str, Any] = {"machine": machine_info(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "options": {"runs": args.runs, "duration_s": args.duration, "warmup_s": args.warmup,
                                           "workers": args.workers, "env": args.env, "pop_prefill": args.pop_prefill,
                                           "consume_wait_ms": args.consume_wait_ms,
                                           "broker_url": args.broker_url}}  # fmt: skip
    broker = None
    try:
        if args.broker_url:
            url, pid, pg_dsn = args.broker_url.rstrip("/"), args.broker_pid, None
            wait_healthy(url, 3)
        else:
            print("starting queen-pg serve with an embedded PostgreSQL ...", flush=True)
            broker = BrokerProcess(workers=args.workers, env=dict(e.split("=", 1) for e in args.env))
            broker.start()
            url, pid = broker.url, broker.pid
            pg_dsn = broker.pg_dsn()
            results["machine"]["postgres"] = postgres_info(pg_dsn)
        print(f"broker {url}" + (f" (pid {pid})" if pid else ""), flush=True)
        profiler = Profiler(pid, args.profile_dir) if profile_keys and pid else None
        ctx = Context(url=url, root_pid=pid, duration=args.duration, warmup=args.warmup,
                      tag=f"{os.getpid()}{int(time.time()) % 100000}", pop_prefill=args.pop_prefill, pg_dsn=pg_dsn,
                      profiler=profiler, consume_wait_ms=args.consume_wait_ms)  # fmt: skip
        rows = []
        for sc in selected:
            print(f"{sc.title} (target {sc.target_text})", flush=True)
            rows.append(run_scenario(ctx, sc, args.runs, sc.key in profile_keys))
            rows[-1]["rss_after_mb"] = _rss_after(pid)
            print(f"  [{sc.key}] broker memory after it: {rows[-1]['rss_after_mb']}", flush=True)
            if profiler is not None and sc.key in profile_keys:
                rows[-1]["profile"] = {k: v for k, v in profiler.summaries.items() if k.startswith(sc.key)}
    except BenchError as exc:
        print(f"queen-pg bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if broker is not None:
            broker.stop()
    results["scenarios"] = rows
    results["machine"]["loadavg_end"] = loadavg()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    write_results(output, results)
    print()
    print(table(rows))
    print(f"\nwrote {output} in {results['elapsed_s']:.0f} s")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
