"""What every scenario shares: its metrics and targets, the context of a sitting (the broker, the
measuring window, the load-generator processes) and the sizing of pre-filled queues.

Pre-fill sizing: a pop scenario must never run out of messages inside its measured window, or it
measures a drain (fewer busy consumers, a shorter window) instead of full load. The first time a
scenario needs a pre-fill it calibrates: it fills ``pop_prefill`` messages, consumes them with the
scenario's own consumers, and takes the rate; every run then gets ``rate × (warm-up + window) ×
PREFILL_MARGIN`` messages (at least ``pop_prefill``), raised for the next runs when a run's own rate
needs more (a calibration on a busy machine underestimates). A run that still drains its queue inside the
window (``ran_dry`` from the load generator) is run again once with what its own rate needs (at least twice
the messages), and the scenario fails if that one drains too: a dry window is never quoted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from benchmarks.broker import BenchError, delete_queue
from benchmarks.machine import ROOT
from benchmarks.profiling import Profiler

PAYLOAD_BYTES = 128
PREFILL_MARGIN = 1.6  # messages pre-filled per run over what the calibrated rate consumes in warm-up + window
PREFILL_MAX = 3_000_000  # a bound on the set-up time (~1 min of fill at the rates seen on the 2-core box)
Values = dict[str, float]
Details = dict[str, Any]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    target: float | None = None  # None: reported, not judged
    op: str = ">="
    label: str = ""  # its name in the summary table when its scenario shows several figures

    def met(self, value: float | None) -> bool | None:
        if self.target is None or value is None:
            return None
        return value >= self.target if self.op == ">=" else value <= self.target


@dataclass(frozen=True)
class PeerLink:
    """One of our figures against the peer's figure for the same shape, measured in the same sitting:
    ``ours(metric) / peer(peer_metric)``, judged against ``target`` (≥) when there is one."""

    metric: str  # our metric
    peer_metric: str  # the metric of the ``peers`` scenario
    target: float | None = None


@dataclass
class Context:
    url: str
    root_pid: int | None
    duration: float
    warmup: float
    tag: str
    pop_prefill: int
    runs: int = 3  # measured runs per scenario (set-ups that are shared by the runs size for all of them)
    pg_dsn: str | None = None  # the started broker's PostgreSQL (floor scenario)
    pg_admin_dsn: str | None = None  # its bootstrap superuser (the peers' throwaway database)
    consume_wait_ms: int = 2_000  # consumers long-poll this long (wait=true); 0 = wait=false + 2 ms sleep
    profiler: Profiler | None = None
    profiling: str | None = None  # the scenario key whose measured calls are being profiled
    shared: dict[str, Any] = field(default_factory=dict)  # set-up results kept across a scenario's runs
    prefill: dict[str, dict[str, Any]] = field(default_factory=dict)  # calibrated pre-fill per scenario

    def queue(self, name: str, run: int | str = "") -> str:
        return f"bench-{self.tag}-{name}{run}"

    def _loadgen(self, spec: dict[str, Any], timeout: float, module: str = "benchmarks.loadgen") -> dict[str, Any]:
        full = {"url": self.url, "tag": self.tag, "payload_bytes": PAYLOAD_BYTES} | spec
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", module, json.dumps(full)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"the load generator ({spec['action']}) ran past {timeout:.0f} s") from None
        if p.returncode != 0 or not p.stdout.strip():
            raise BenchError(f"the load generator ({spec['action']}) failed (rc={p.returncode}): {p.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
        if result.get("errors") and not result.get("count"):
            raise BenchError(f"{spec['action']}: every request failed; first error: {result.get('first_error')}")
        return result

    def setup(self, spec: dict[str, Any], module: str = "benchmarks.loadgen") -> dict[str, Any]:
        """Untimed work (pre-filling); fails the scenario if anything in it failed."""
        r = self._loadgen(spec, timeout=900, module=module)
        if r.get("errors"):
            raise BenchError(f"set-up {spec['action']} failed: {r.get('first_error')}")
        return r

    def measure(self, spec: dict[str, Any], label: str = "", module: str = "benchmarks.loadgen") -> dict[str, Any]:
        timed = {"warmup": self.warmup, "duration": self.duration, "root_pid": self.root_pid,
                 "poll_ms": self.consume_wait_ms} | spec  # fmt: skip
        prof = self.profiler
        rec = prof.record(f"{self.profiling}{label}") if prof is not None and self.profiling else nullcontext()
        with rec:
            return self._loadgen(timed, timeout=timed["warmup"] + timed["duration"] + 120, module=module)

    def delete(self, queue: str) -> None:
        delete_queue(self.url, queue)


def rate(r: dict[str, Any]) -> float:
    return float(r["rate"])


# A pop run: (messages to pre-fill, a label for its queue, spec overrides) -> the load generator's result
PopRun = Callable[[int, str, dict[str, Any]], dict[str, Any]]
CALIBRATION_WARMUP = 0.3  # s: the calibration drains pop_prefill; a short warm-up leaves most of it to measure


def _need(ctx: Context, msg_s: float) -> int:
    return math.ceil(msg_s * (ctx.warmup + ctx.duration) * PREFILL_MARGIN / 10_000) * 10_000


def prefill_size(ctx: Context, key: str, pop_run: PopRun) -> int:
    """Messages one measured pop run of ``key`` needs (calibrated on the first call, see the module)."""
    if key not in ctx.prefill:
        probe = pop_run(ctx.pop_prefill, "cal", {"warmup": min(ctx.warmup, CALIBRATION_WARMUP)})
        r = probe.get("rate") or 0.0
        size = min(PREFILL_MAX, max(ctx.pop_prefill, _need(ctx, r)))
        ctx.prefill[key] = {"calibration": {k: probe.get(k) for k in ("rate", "count", "elapsed_s", "per_group",
                                                                      "ran_dry", "prefill")},
                            "messages": size}  # fmt: skip
        print(f"  [{key}] calibrated: {r:,.0f} msg/s over {probe.get('elapsed_s')} s -> {size:,} messages per run",
              flush=True)  # fmt: skip
    return int(ctx.prefill[key]["messages"])


def full_window(ctx: Context, key: str, run: int, pop_run: PopRun) -> dict[str, Any]:
    """One measured pop run whose queue lasts the whole window: sized by ``prefill_size``, run again with
    what its rate needs (at least twice the messages) if it drained, a ``BenchError`` if it drained again."""
    size = prefill_size(ctx, key, pop_run)
    r = pop_run(size, str(run), {})
    if r.get("ran_dry"):
        # what the dry run's own rate needs, at least twice what it had: a calibration over a small
        # pre-fill is mostly ramp-up and can fall short by more than half
        size = min(PREFILL_MAX, max(2 * size, _need(ctx, rate(r))))
        print(f"  [{key}] run {run + 1} drained its messages after {r['elapsed_s']} s of the window "
              f"({rate(r):,.0f} msg/s): again with {size:,}", flush=True)  # fmt: skip
        dry = {k: r.get(k) for k in ("rate", "count", "elapsed_s", "prefill")}
        ctx.prefill[key]["messages"] = size
        r = pop_run(size, f"{run}b", {})
        r["dry_attempt"] = dry
        if r.get("ran_dry"):
            raise BenchError(f"{key}: the queue ran dry inside the measured window twice (last {size:,} messages, "
                             f"{r['elapsed_s']} s of {ctx.duration} s)")  # fmt: skip
    # a calibration on a busy machine underestimates: the next runs get what this run's rate needs, if more
    ctx.prefill[key]["messages"] = min(PREFILL_MAX, max(ctx.prefill[key]["messages"], _need(ctx, rate(r))))
    return r
