"""A paired A/B of two source trees that host drift cannot fake: both brokers run side by side (one
worker each, an embedded PostgreSQL each) and one sequential client alternates short blocks of the
same request between them (A B, B A, A B, ...), so a slower minute lands on both sides alike. On this
2-core VM the same commit's figures drift by 30-40 % between sittings of ``make bench``, which hides
any change worth less than that; the block-by-block comparison does not.

    python -m benchmarks.pair --a /path/to/old-tree                # A = that tree (its .venv), B = this one
    python -m benchmarks.pair --a /path/to/old-tree --request miss --blocks 10 --per-block 800 \
        --json benchmarks/results/<date>-<commit>-pair.json

Per side it reports the broker's CPU per request (its Python processes, from /proc; PostgreSQL's
apart), the median latency, and in how many blocks B was cheaper and faster. The requests:
``push`` (a 1-item JSON push to one partition: the latency scenario's request), ``push100`` (100
items in one JSON push, the throughput scenario's request shape), ``miss`` (a GET of a
path no route has: the framework's routing and error answer, no database), ``health``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.broker import BrokerProcess
from benchmarks.machine import ROOT, git_state, loadavg, machine_info
from benchmarks.procstat import tree_cpu

PUSH_BODY = json.dumps({"items": [{"queue": "pair-bench", "partition": "p", "payload": {"n": 1}}]}).encode()
PUSH100_BODY = json.dumps(
    {"items": [{"queue": "pair-bench", "partition": "p", "payload": {"n": i}} for i in range(100)]}
).encode()
REQUESTS: dict[str, tuple[str, str, bytes | None]] = {
    "push": ("POST", "/api/v1/push", PUSH_BODY),
    "push100": ("POST", "/api/v1/push", PUSH100_BODY),
    "miss": ("GET", "/no/such/route", None),
    "health": ("GET", "/health", None),
}


@dataclass(frozen=True)
class Side:
    """A broker under comparison: where it listens and the pid whose process tree is its CPU."""

    url: str
    pid: int


def block(side: Side, request: str, n: int, cpu: Callable[[int], dict[str, float]] = tree_cpu) -> dict[str, float]:
    """``n`` sequential requests on one keep-alive connection: broker and PostgreSQL CPU µs per request
    and the latencies' median (ms). Any answer outside 2xx (``miss``: 404) is an error."""
    method, path, body = REQUESTS[request]
    expected = 404 if request == "miss" else None
    u = urlsplit(side.url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    lat: list[float] = []
    before = cpu(side.pid)
    try:
        for _ in range(n):
            t = time.perf_counter()
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            lat.append(time.perf_counter() - t)
            if (resp.status != expected) if expected else not 200 <= resp.status < 300:
                raise RuntimeError(f"{method} {path} answered {resp.status} at {side.url}")
    finally:
        conn.close()
    after = cpu(side.pid)
    return {
        "broker_us": (after["broker"] - before["broker"]) / n * 1e6,
        "postgres_us": (after["postgres"] - before["postgres"]) / n * 1e6,
        "p50_ms": statistics.median(lat) * 1e3,
    }


def run_pair(
    a: Side, b: Side, request: str, blocks: int, per_block: int,
    cpu: Callable[[int], dict[str, float]] = tree_cpu, progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:  # fmt: skip
    """``blocks`` rounds; round i runs A then B when i is even, B then A when odd. The summary holds
    each side's medians (and the blocks themselves) and B's wins per round."""
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    sides = {"A": a, "B": b}
    for i in range(blocks):
        for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
            runs[name].append(block(sides[name], request, per_block, cpu))
        progress(f"  block {i + 1}/{blocks}: A {runs['A'][-1]['broker_us']:.0f} µs, {runs['A'][-1]['p50_ms']:.3f} ms;"
                 f" B {runs['B'][-1]['broker_us']:.0f} µs, {runs['B'][-1]['p50_ms']:.3f} ms")  # fmt: skip
    pairs = list(zip(runs["A"], runs["B"], strict=True))
    return {
        "request": request,
        "blocks": blocks,
        "per_block": per_block,
        "sides": {
            name: {key: statistics.median(r[key] for r in rs) for key in ("broker_us", "postgres_us", "p50_ms")}
            | {"runs": rs}
            for name, rs in runs.items()
        },
        "b_cheaper": sum(1 for ra, rb in pairs if rb["broker_us"] < ra["broker_us"]),
        "b_faster": sum(1 for ra, rb in pairs if rb["p50_ms"] < ra["p50_ms"]),
    }


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['request']}: {res['blocks']} blocks of {res['per_block']} sequential requests per side"]
    for name in ("A", "B"):
        s = res["sides"][name]
        lines.append(f"  {name}: broker {s['broker_us']:.0f} µs/request, PostgreSQL {s['postgres_us']:.0f} µs/request,"
                     f" p50 {s['p50_ms']:.3f} ms (medians of the blocks)")  # fmt: skip
    n = res["blocks"]
    lines.append(f"  B cheaper in {res['b_cheaper']}/{n} blocks, faster in {res['b_faster']}/{n}")
    return "\n".join(lines)


def _tree(path: Path) -> dict[str, Any]:
    """A side's source tree: its commit and whether it had uncommitted changes (not its path, which is
    this machine's and says nothing about the code)."""
    commit, dirty = git_state(path)
    return {"commit": commit, "dirty": dirty}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.pair",
        description="Paired A/B of two source trees: their brokers side by side, alternating blocks of one "
        "sequential request; broker CPU and latency per request, and how often B won.",
    )
    ap.add_argument("--a", type=Path, required=True, help="side A's source tree (with its own .venv: make install)")
    ap.add_argument("--b", type=Path, default=ROOT, help=f"side B's source tree [{ROOT}]")
    ap.add_argument("--request", default="push,miss", help=f"comma-separated, of {', '.join(REQUESTS)} [push,miss]")
    ap.add_argument("--blocks", type=int, default=10, help="rounds (each side runs one block per round) [10]")
    ap.add_argument("--per-block", type=int, default=800, help="sequential requests per block [800]")
    ap.add_argument(
        "--json",
        type=Path,
        help="also write the results (with the machine and both commits) here, e.g. "
        "benchmarks/results/<date>-<commit>-pair.json",
    )
    args = ap.parse_args(argv)
    kinds = [k for k in args.request.split(",") if k]
    unknown = [k for k in kinds if k not in REQUESTS]
    if unknown or not kinds or args.blocks < 1 or args.per_block < 1:
        ap.error(f"--request takes {', '.join(REQUESTS)}; --blocks and --per-block at least 1 (got {args.request})")
    for tree in (args.a, args.b):
        if not (tree / ".venv" / "bin" / "python").exists():
            ap.error(f"{tree} has no .venv/bin/python: run `make install` there first")
    print(f"starting two brokers (A: {args.a}, B: {args.b}), one worker each ...", flush=True)
    with BrokerProcess(workers=1, root=args.a) as ba, BrokerProcess(workers=1, root=args.b) as bb:
        a, b = Side(ba.url, ba.pid), Side(bb.url, bb.pid)
        results = []
        for kind in kinds:
            block(a, kind, 50)  # warm both: plans, caches, the queue's first push
            block(b, kind, 50)
            res = run_pair(a, b, kind, args.blocks, args.per_block, progress=lambda s: print(s, flush=True))
            print(report(res), flush=True)
            results.append(res)
    if args.json is not None:
        doc = {"machine": machine_info(), "a": _tree(args.a), "b": _tree(args.b), "load_average": loadavg(),
               "results": results}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
