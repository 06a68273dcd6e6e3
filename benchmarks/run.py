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
EPILOG = """make bench passes BENCH_ARGS to these options, e.g.:
  make bench                                                  # every scenario, 3 runs, ~10 min
  make bench BENCH_ARGS="--scenarios pop_ack,peers --runs 1 --duration 3"
  make bench BENCH_ARGS="--workers 2 --env QUEEN_FUSE_HOLD_US=500"
  make bench BENCH_ARGS="--list"                              # the scenarios and their targets
Pop scenarios (pop_ack, pop_ack_binary, fanout, peers' pop) calibrate their pre-fill once (--pop-prefill
messages consumed at full load) and pre-fill every run for warm-up + window at that rate x 1.6; a run that
drains its queue inside the window is redone with twice the messages, and the scenario fails if it drains
again. The ratios ours/pgmq need the peers scenario in the same invocation (it needs a started broker,
not --broker-url)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queen-pg bench",
        description="Run the benchmark suite: start a broker (embedded PostgreSQL in a temporary dir) or use "
        "--broker-url, drive it over HTTP from a separate load-generator process, run pgmq on the same shapes "
        "in a throwaway database of the same PostgreSQL (scenario peers), print a markdown table (ours, pgmq, "
        "ratio, target) and the cores each side used, and write one results file. Targets missed are "
        "reported, not errors.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    p.add_argument("--pop-prefill", type=int, default=100_000,
                   help="messages of each pop scenario's calibration, and the least any pop run is pre-filled with "
                   "[100000]")  # fmt: skip
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
    row["cores"] = cores_of(row["runs"])
    # the calibrated pre-fill of its pop runs (benchmarks/context.py), redone dry runs in the run details
    row["prefill"] = {k: v for k, v in ctx.prefill.items() if k == sc.key or k.startswith(sc.key + ".")} or None
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


ROLES = ("broker", "postgres", "loadgen", "other")
PEER_NAME = "pgmq 1.5.1"


def _parts(details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The load-generator results of one run: the run itself, or its named parts (fan-out, peers' shapes)."""
    if "cpu_cores" in details:
        return {"": details}
    return {k: v for k, v in details.items() if isinstance(v, dict) and "cpu_cores" in v}


def cores_of(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per part of a scenario, the median over its runs of the cores each role used in the measured window
    (broker processes, PostgreSQL's processes, the load generator, the rest of the machine) and of the
    window's length."""
    by_part: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        for part, d in _parts(r["details"]).items():
            by_part.setdefault(part, []).append(d)
    out: dict[str, dict[str, float]] = {}
    for part, ds in by_part.items():
        out[part] = {role: round(statistics.median(d["cpu_cores"].get(role, 0.0) for d in ds), 2) for role in ROLES}
        out[part]["window_s"] = round(statistics.median(d["elapsed_s"] for d in ds), 2)
    return out


def link_peers(rows: list[dict[str, Any]]) -> None:
    """Each of our figures that names a peer shape gets ``vs_peer``: ours, the peer's median from the same
    sitting, the ratio and its target; the row's ``met`` then counts the ratio targets too."""
    peer_row = next((r for r in rows if r["key"] == "peers"), None)
    peer = {m["name"]: m["median"] for m in peer_row["metrics"]} if peer_row and not peer_row["error"] else {}
    for row in rows:
        links = BY_KEY[row["key"]].peers
        if not links:
            continue
        ours = {m["name"]: m["median"] for m in row["metrics"]}
        row["vs_peer"] = []
        for link in links:
            o, p = ours.get(link.metric), peer.get(link.peer_metric)
            ratio = o / p if o is not None and p and not math.isnan(o) and not math.isnan(p) else None
            met = None if ratio is None or link.target is None else ratio >= link.target
            row["vs_peer"].append({"peer_name": PEER_NAME, "metric": link.metric, "peer_metric": link.peer_metric,
                                   "ours": o, "peer": p, "ratio": None if ratio is None else round(ratio, 3),
                                   "target": link.target, "met": met})  # fmt: skip
        judged = [m["met"] for m in row["metrics"] if m["met"] is not None]
        judged += [v["met"] for v in row["vs_peer"] if v["met"] is not None]
        row["met"] = False if row["error"] else (all(judged) if judged else None)


def _yes(met: bool | None) -> str:
    return {True: "yes", False: "no", None: "–"}[met]


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table the README quotes: one line per judged figure (a ratio to pgmq where the
    scenario has one); scenarios without a target (floor, the peers themselves) are left out."""
    lines = ["| scenario | ours | pgmq | ratio | target | met? |", "|---|---|---|---|---|---|"]
    for row in rows:
        links = {v["metric"]: v for v in row.get("vs_peer", [])}
        by_name = {m.name: m for m in BY_KEY[row["key"]].metrics}
        shown = [m for m in row["metrics"] if m["target"] is not None or m["name"] in links]
        for m in shown:
            label = by_name[m["name"]].label
            title = f"{row['title']}: {label or m['name']}" if len(shown) > 1 else row["title"]
            link = links.get(m["name"])
            ours = "error" if row["error"] else fmt(m["median"], m["unit"])
            peer = fmt(link["peer"], m["unit"]) if link and link["peer"] is not None else "–"
            ratio = f"{link['ratio']:.2f}×" if link and link["ratio"] is not None else "–"
            if link and link["target"] is not None:
                target, met = f"≥ {link['target']:.2f}× pgmq", link["met"]
            elif m["target"] is not None:
                target, met = f"{'≥' if m['op'] == '>=' else '≤'} {fmt(m['target'], m['unit'])}", m["met"]
            else:
                target, met = "–", None
            verdict = "error" if row["error"] else _yes(met)
            lines.append(f"| {title} | {ours} | {peer} | {ratio} | {target} | {verdict} |")
    return "\n".join(lines)


def cores_table(rows: list[dict[str, Any]]) -> str:
    """Cores used during the measured windows (medians over the runs), and how long the windows were."""
    lines = ["| scenario | broker | PostgreSQL | load generator | other | window (s) |", "|---|---|---|---|---|---|"]
    for row in rows:
        for part, c in (row.get("cores") or {}).items():
            name = f"{row['key']} {part}".strip()
            lines.append(f"| {name} | {c['broker']:.2f} | {c['postgres']:.2f} | {c['loadgen']:.2f} | {c['other']:.2f} "
                         f"| {c['window_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


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
            url, pid, pg_dsn, pg_admin_dsn = args.broker_url.rstrip("/"), args.broker_pid, None, None
            wait_healthy(url, 3)
        else:
            print("starting queen-pg serve with an embedded PostgreSQL ...", flush=True)
            broker = BrokerProcess(workers=args.workers, env=dict(e.split("=", 1) for e in args.env))
            broker.start()
            url, pid = broker.url, broker.pid
            pg_dsn, pg_admin_dsn = broker.pg_dsn(), broker.pg_admin_dsn()
            results["machine"]["postgres"] = postgres_info(pg_dsn)
        print(f"broker {url}" + (f" (pid {pid})" if pid else ""), flush=True)
        profiler = Profiler(pid, args.profile_dir) if profile_keys and pid else None
        ctx = Context(url=url, root_pid=pid, duration=args.duration, warmup=args.warmup,
                      tag=f"{os.getpid()}{int(time.time()) % 100000}", pop_prefill=args.pop_prefill, pg_dsn=pg_dsn,
                      pg_admin_dsn=pg_admin_dsn, runs=args.runs,
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
    link_peers(rows)
    results["scenarios"] = rows
    results["machine"]["loadavg_end"] = loadavg()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["table_md"] = table(rows)
    results["cores_md"] = cores_table(rows)
    write_results(output, results)
    print()
    print(results["table_md"])
    print()
    print(results["cores_md"])
    print(f"\nwrote {output} in {results['elapsed_s']:.0f} s")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
