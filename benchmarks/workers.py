"""``--workers`` 1 vs 2 on this machine: the JSON suite (push 100, push 1, pop + ack,
latency) against a broker started with ``queen-pg serve --workers 1``, then one with ``--workers 2``,
both written to one results file with each run's CPU µs per message (broker, PostgreSQL) and the
machine's load, so the better default for ``make run`` can be read off one file.

    python -m benchmarks.workers [--runs 3] [--duration 5] [--output benchmarks/results/<date>-<commit>-workers.json]

Each configuration is a plain ``benchmarks.run`` (its own broker and embedded PostgreSQL); the
comparison quotes, per scenario, the medians and the ratio 2 workers / 1 worker. On a loaded machine the
wall-clock rates are lower bounds: compare the CPU µs per message and the ``other`` cores too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import ROOT, loadavg, machine_info, result_path
from benchmarks.run import write_results

SUITE = "push_batch100,push_single,pop_ack,latency"


def _figures(run: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in run.get("scenarios", []):
        figs = {m["name"]: m["median"] for m in row["metrics"]}
        costs = [r["cost"] for r in row["runs"] if r.get("cost")]
        for key in ("broker_us_per_msg", "postgres_us_per_msg"):
            vals = sorted(c[key] for c in costs if key in c)
            if vals:
                figs[key] = vals[len(vals) // 2]
        others = sorted(r["details"].get("cpu_cores", {}).get("other", 0.0) for r in row["runs"])
        if others:
            figs["other_cores"] = others[len(others) // 2]
        figs["error"] = row.get("error")
        out[row["key"]] = figs
    return out


def compare(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Per scenario and figure: the 2-worker median over the 1-worker one."""
    f1, f2 = _figures(one), _figures(two)
    out: dict[str, Any] = {}
    for key in f1:
        ratios = {}
        for name, v1 in f1[key].items():
            v2 = f2.get(key, {}).get(name)
            if isinstance(v1, int | float) and isinstance(v2, int | float) and v1:
                ratios[name] = round(v2 / v1, 3)
        out[key] = {"workers_1": f1[key], "workers_2": f2.get(key), "ratio_2_over_1": ratios}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="queen-pg bench-workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--scenarios", default=SUITE)
    p.add_argument("--output", type=Path, help="[benchmarks/results/<date>-<commit>-workers.json]")
    args = p.parse_args(argv)
    output = args.output or result_path("workers")
    results: dict[str, Any] = {"machine": machine_info(), "scenarios": args.scenarios, "runs": args.runs,
                               "duration_s": args.duration, "configs": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="queen-workers-") as tmp:
        for n in (1, 2):
            out = Path(tmp) / f"w{n}.json"
            print(f"=== --workers {n} (load {loadavg()}) ===", flush=True)
            cmd = [sys.executable, "-m", "benchmarks.run", "--scenarios", args.scenarios, "--runs", str(args.runs),
                   "--duration", str(args.duration), "--workers", str(n), "--output", str(out)]  # fmt: skip
            rc = subprocess.call(cmd, cwd=ROOT)
            if not out.exists():
                print(f"queen-pg bench-workers: the --workers {n} run wrote nothing (rc={rc})", file=sys.stderr)
                return 1
            results["configs"][f"workers_{n}"] = json.loads(out.read_text())
    results["comparison"] = compare(results["configs"]["workers_1"], results["configs"]["workers_2"])
    results["machine"]["loadavg_end"] = loadavg()
    write_results(output, results)
    for key, c in results["comparison"].items():
        print(f"{key:16} 2 workers / 1: {c['ratio_2_over_1']}")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
