"""The benchmark scenarios and their targets. One run of a scenario calls the load generator once or
twice and returns the values its metrics read; ``run.py`` repeats runs and quotes medians.

Shapes (the targets name the counts; the rest is chosen here and recorded in the results file):
- push, 100 items/request, 32 clients: each client pushes to its own partition of one queue.
- push, 1 item/request, 128 clients: each client pushes to its own partition of one queue.
- binary push / framed pop + ack: the same shapes as push 100 and pop + ack, on the binary wire (docs/wire.md)
  as the official client's binary_push + push_compression / framed_pop send and read it; the load
  generator frames, mints ids and compresses every request, and decompresses every answer, as that client.
- pop + ack: 10 partitions pre-filled with 100 messages per push (not timed), enough for the whole
  window at the calibrated rate (``benchmarks/context.py``: a run that drains is redone, never quoted);
  10 queue-mode consumers loop pop ``batch=100`` + one ``/ack/batch``; rate = acknowledged messages per s.
- latency: one client, one item per push, sequential, each push waits for the previous answer.
- fan-out: one queue of 10 partitions pre-filled as a pop run is (sized for the single group, which reads
  fastest); a single group of 10 consumers, then 10
  groups of 10 consumers each (fresh group names each run, so each reads from the start); the metric is
  total deliveries per second of the 10 groups over the single group's.
- 10,000 partitions: 32 clients push one item per request round-robin over 10,000 existing partitions
  (one message each made in set-up), vs the same over 10 partitions; the metric is the ratio in %.
- partition scale: queues with 1, 1,000, 10,000 and 100,000 pending partitions whose
  queue-mode group exists before they are filled (a running consumer: its cursors are woken by the
  pushes); one client pops sequentially naming no partition (batch 1, autoAck, so nothing stays leased
  and each pop moves one cursor); the metric is the p50 of those pops, with CPU µs per pop; then 200
  calls of queen.pop_v1 straight over the started broker's PostgreSQL socket (the same pop without the
  HTTP hop and the rendering: the discovery's own cost). Each queue
  holds ≥ 20,000 messages (1 per partition at 100k, 20,000 in the single partition) so no run drains it.
  Then push 1 item/request, 32 clients, round-robin over 10,000 partitions vs all on one partition, both
  queues with a group; the metric is the ratio in %. Pre-filling runs in chunks of 10,000 partitions of
  1,000-item pushes, with progress lines.
- floor (no target): a bare FastAPI route on the same stack, without and with one asyncpg ``SELECT 1``,
  driven like the single-push scenario: the CPU one request costs on this machine before queen-pg's work.
- peers: pgmq 1.5.1 on the push 100, push 1, pop + ack and latency shapes, in a throwaway database of the
  same PostgreSQL (``benchmarks/peers/pgmq.py``); the scenarios above that name it quote ours / pgmq.
- memory: VmRSS of each broker worker after all other scenarios (from /proc/<pid>/status).
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from benchmarks.broker import BenchError, free_port, http, wait_healthy
from benchmarks.context import Context, Details, Metric, PeerLink, Values, full_window, prefill_size
from benchmarks.context import rate as _rate
from benchmarks.machine import ROOT
from benchmarks.peers.pgmq import METRICS as PEER_METRICS
from benchmarks.peers.pgmq import peers, peers_setup, peers_teardown
from benchmarks.procstat import broker_processes, workers

__all__ = ["BY_KEY", "SCENARIOS", "Context", "Metric", "PeerLink", "Scenario"]


def push_batch(ctx: Context, run: int) -> tuple[Values, Details]:
    q = ctx.queue("push100-", run)
    r = ctx.measure({"action": "push", "queue": q, "clients": 32, "items": 100, "partitions": 32})
    ctx.delete(q)
    return {"msg_s": _rate(r)}, r


def push_batch_binary(ctx: Context, run: int) -> tuple[Values, Details]:
    q = ctx.queue("push100b-", run)
    spec = {"action": "push", "queue": q, "clients": 32, "items": 100, "partitions": 32, "binary": True}
    r = ctx.measure(spec)
    ctx.delete(q)
    return {"msg_s": _rate(r)}, r


def push_single(ctx: Context, run: int) -> tuple[Values, Details]:
    q = ctx.queue("push1-", run)
    r = ctx.measure({"action": "push", "queue": q, "clients": 128, "items": 1, "partitions": 128})
    ctx.delete(q)
    return {"msg_s": _rate(r)}, r


def _fill(ctx: Context, queue: str, partitions: int, total: int, per_req: int = 100) -> dict[str, Any]:
    spec = {"action": "fill", "queue": queue, "partitions": partitions, "per_partition": max(1, total // partitions),
            "per_req": per_req, "concurrency": min(partitions, 10)}  # fmt: skip
    return ctx.setup(spec)


def _pop_ack(ctx: Context, key: str, run: int, frames: bool) -> tuple[Values, Details]:
    """10 queue-mode consumers on 10 partitions filled for a full window (``full_window``)."""

    def pop_run(messages: int, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
        q = ctx.queue(f"{key}-", label)
        try:
            fill = _fill(ctx, q, 10, messages)
            spec = {"action": "consume", "queue": q, "groups": [None], "consumers": 10, "batch": 100,
                    "expect": fill["count"], "frames": frames} | overrides  # fmt: skip
            return ctx.measure(spec) | {"prefill": fill}
        finally:
            ctx.delete(q)

    r = full_window(ctx, key, run, pop_run)
    return {"msg_s": _rate(r)}, r


def pop_ack(ctx: Context, run: int) -> tuple[Values, Details]:
    return _pop_ack(ctx, "pop_ack", run, frames=False)


def pop_ack_binary(ctx: Context, run: int) -> tuple[Values, Details]:
    return _pop_ack(ctx, "pop_ack_binary", run, frames=True)


def latency(ctx: Context, run: int) -> tuple[Values, Details]:
    q = ctx.queue("latency-", run)
    r = ctx.measure({"action": "latency", "queue": q, "partitions": 1})
    ctx.delete(q)
    lat = r.get("latency_ms") or {}
    return {"p50_ms": lat.get("p50", float("nan")), "p99_ms": lat.get("p99", float("nan"))}, r


def fanout_setup(ctx: Context) -> None:
    """One queue for every run (each run's groups read it from the start), sized as a pop run's for the
    single group, which reads fastest (``prefill_size``)."""

    def single_group(messages: int, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
        q = ctx.queue("fanout-", label)
        try:
            fill = _fill(ctx, q, 10, messages)
            spec = {"action": "consume", "queue": q, "consumers": 10, "batch": 100, "expect": fill["count"],
                    "groups": [f"g{ctx.tag}-cal"]} | overrides  # fmt: skip
            return ctx.measure(spec) | {"prefill": fill}
        finally:
            ctx.delete(q)

    q = ctx.shared["queue"] = ctx.queue("fanout")
    ctx.shared["fill"] = _fill(ctx, q, 10, prefill_size(ctx, "fanout", single_group))


def _pop_cache_lookups(ctx: Context) -> dict[str, float]:
    """The broker's pop segment-cache counters (hit, miss, eviction) from /metrics (one worker's when
    there are several: a scrape reaches one)."""
    import urllib.request

    out: dict[str, float] = {}
    with urllib.request.urlopen(f"{ctx.url}/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("queen_pop_cache_lookups_total{"):
                result = line.split('result="', 1)[1].split('"', 1)[0]
                out[result] = out.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def fanout(ctx: Context, run: int) -> tuple[Values, Details]:
    q, total = ctx.shared["queue"], ctx.shared["fill"]["count"]
    base = {"action": "consume", "queue": q, "consumers": 10, "batch": 100, "expect": total}
    one = ctx.measure(base | {"groups": [f"g{ctx.tag}-single-{run}"]}, "-single")
    before = _pop_cache_lookups(ctx)
    ten = ctx.measure(base | {"groups": [f"g{ctx.tag}-fan-{run}-{g}" for g in range(10)]}, "-fanout")
    after = _pop_cache_lookups(ctx)
    if one["ran_dry"] or ten["ran_dry"]:  # set-up sized the queue for the single group: report, never quote
        raise BenchError(f"fanout: the queue of {total:,} messages ran dry inside the window (single group "
                         f"{one['elapsed_s']} s, ten groups {ten['elapsed_s']} s)")  # fmt: skip
    hits, misses = (after.get(k, 0.0) - before.get(k, 0.0) for k in ("hit", "miss"))
    values = {"ratio": _rate(ten) / max(_rate(one), 1e-9), "single_msg_s": _rate(one), "fanout_msg_s": _rate(ten),
              "cache_hit_pct": 100 * hits / (hits + misses) if hits + misses else float("nan")}  # fmt: skip
    return values, {"single": one, "fanout": ten, "pop_cache": {"before": before, "after": after}}


def partitions_setup(ctx: Context) -> None:
    for n in (10, 10_000):
        q = ctx.shared[f"q{n}"] = ctx.queue(f"parts{n}")
        _fill(ctx, q, n, n, per_req=1000)


def partitions(ctx: Context, run: int) -> tuple[Values, Details]:
    base = {"action": "push", "clients": 32, "items": 1, "partition_mode": "spread"}
    ten = ctx.measure(base | {"queue": ctx.shared["q10"], "partitions": 10}, "-10")
    many = ctx.measure(base | {"queue": ctx.shared["q10000"], "partitions": 10_000}, "-10k")
    pct = 100 * _rate(many) / max(_rate(ten), 1e-9)
    return {"pct_of_10": pct, "rate_10k_msg_s": _rate(many), "rate_10_msg_s": _rate(ten)}, {"p10": ten, "p10k": many}


SCALE_SIZES = (1, 1_000, 10_000, 100_000)
SCALE_MESSAGES = 20_000  # at least this many messages per queue
SCALE_POPS_S = 5_000  # more sequential pops a second than one client has made (0.5 ms each on a fast host)


def scale_messages(ctx: Context) -> int:
    """Messages per pop queue of ``partition_scale``: every run's HTTP pops (warm-up and window, at
    SCALE_POPS_S) and its SQL pops, for all the runs the queue serves: the pops never drain it."""
    per_run = math.ceil((ctx.warmup + ctx.duration) * SCALE_POPS_S) + SQL_POPS
    return max(SCALE_MESSAGES, ctx.runs * per_run)


def _with_group(ctx: Context, queue: str) -> None:
    """The queue exists with its queue-mode group before the partitions are filled (the consumer came
    first): one message to partition `seed`, taken by an autoAck pop."""
    status, body = http("POST", f"{ctx.url}/api/v1/push",
                        {"items": [{"queue": queue, "partition": "seed", "payload": {"seed": True}}]})  # fmt: skip
    if status != 201:
        raise BenchError(f"seed push to {queue}: {status} {body}")
    status, body = http("GET", f"{ctx.url}/api/v1/pop/queue/{quote(queue, safe='')}?batch=1&wait=false&autoAck=true")
    if status != 200:
        raise BenchError(f"seed pop of {queue}: {status} {body}")


def _fill_progress(ctx: Context, queue: str, partitions: int, per_partition: int, per_req: int = 1000) -> None:
    chunk = 10_000
    t0 = time.monotonic()
    for first in range(0, partitions, chunk):
        n = min(chunk, partitions - first)
        ctx.setup({"action": "fill", "queue": queue, "partitions": n, "first_partition": first,
                   "per_partition": per_partition, "per_req": per_req, "concurrency": min(n, 4)})  # fmt: skip
        if partitions > chunk:
            print(f"  [partition_scale] {queue}: {first + n:,}/{partitions:,} partitions filled "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip


def scale_setup(ctx: Context) -> None:
    for n in SCALE_SIZES:
        q = ctx.shared[f"pop{n}"] = ctx.queue(f"scale-pop{n}-")
        _with_group(ctx, q)
        # small segments (≤ 10 messages where a partition holds many): a pop of 1 then costs the claim,
        # not the decoding of a large segment's other frames (the segment cache's subject, not this one's)
        _fill_progress(ctx, q, n, max(1, -(-scale_messages(ctx) // n)), per_req=min(1000, 10 * n))
    for n in (1, 10_000):
        q = ctx.shared[f"push{n}"] = ctx.queue(f"scale-push{n}-")
        _with_group(ctx, q)
        _fill_progress(ctx, q, n, 1)
    _vacuum_filled(ctx)


def _vacuum_filled(ctx: Context) -> None:
    """VACUUM (ANALYZE) the tables a large fill wrote, so that autovacuum does not start on them inside
    the first measured window (seen: a first run whose pops waited 19 ms on a PostgreSQL busy with it)."""
    if ctx.pg_dsn is None:
        return
    import psycopg

    t0 = time.monotonic()
    with psycopg.connect(ctx.pg_dsn, autocommit=True) as conn:
        for table in ("queues", "log_partitions", "log_consumers", "log_segments", "log_txns"):
            conn.execute(f"VACUUM (ANALYZE) queen.{table}")
    print(f"  [partition_scale] VACUUM (ANALYZE) of the filled tables: {time.monotonic() - t0:.1f} s", flush=True)


SQL_POPS = 200  # pop_v1 calls straight per queue and run (_sql_pop_p50)
SQL_POP = (
    "SELECT count(*) FROM queen.pop_v1('default', %s, NULL, NULL, NULL, '__QUEUE_MODE__', 1, 1, gen_random_uuid(), "
    "true, NULL, NULL)"
)


def _sql_pop_p50(ctx: Context, queue: str, pops: int = SQL_POPS) -> float:
    """p50 in ms of queen.pop_v1 called straight (psycopg, Unix socket): discovery and claim without the
    HTTP hop and the broker's rendering. NaN without the started broker's PostgreSQL."""
    if ctx.pg_dsn is None:
        return float("nan")
    import psycopg

    lat = []
    with psycopg.connect(ctx.pg_dsn, autocommit=True) as conn:
        for _ in range(pops):
            t0 = time.perf_counter()
            row = conn.execute(SQL_POP, (queue,)).fetchone()
            lat.append((time.perf_counter() - t0) * 1000)
            if not row or row[0] == 0:
                raise BenchError(f"{queue} ran dry during the SQL pops")
    return statistics.median(lat)


def _per_op_us(r: dict[str, Any], role: str) -> float:
    return float(r["cpu_cores"].get(role, 0.0)) * 1e6 / max(_rate(r), 1e-9)


def partition_scale(ctx: Context, run: int) -> tuple[Values, Details]:
    values: Values = {}
    details: Details = {}
    for n in SCALE_SIZES:
        r = ctx.measure({"action": "pop_latency", "queue": ctx.shared[f"pop{n}"]}, f"-pop{n}")
        lat = r.get("latency_ms") or {}
        values[f"pop_p50_ms_{n}"] = lat.get("p50", float("nan"))
        values[f"pop_broker_us_{n}"] = _per_op_us(r, "broker")
        values[f"pop_pg_us_{n}"] = _per_op_us(r, "postgres")
        values[f"pop_sql_p50_ms_{n}"] = _sql_pop_p50(ctx, ctx.shared[f"pop{n}"])
        details[f"pop{n}"] = r
    base = {"action": "push", "clients": 32, "items": 1, "partition_mode": "spread"}
    one = ctx.measure(base | {"queue": ctx.shared["push1"], "partitions": 1}, "-push1")
    many = ctx.measure(base | {"queue": ctx.shared["push10000"], "partitions": 10_000}, "-push10k")
    values["push_pct_10k_of_1"] = 100 * _rate(many) / max(_rate(one), 1e-9)
    values["push_msg_s_1"], values["push_msg_s_10k"] = _rate(one), _rate(many)
    for key, r in (("1", one), ("10k", many)):
        values[f"push_broker_us_{key}"] = _per_op_us(r, "broker")
        values[f"push_pg_us_{key}"] = _per_op_us(r, "postgres")
    details["push1"], details["push10k"] = one, many
    return values, details


def floor_setup(ctx: Context) -> None:
    if ctx.pg_dsn is None:
        raise BenchError("the floor scenario needs the PostgreSQL of a broker started by the harness")
    for mode in ("plain", "db"):
        port = free_port()
        cmd = [sys.executable, "-m", "benchmarks.floor_app", str(port), mode, ctx.pg_dsn]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        ctx.shared[f"proc_{mode}"] = proc
        ctx.shared[f"url_{mode}"] = f"http://127.0.0.1:{port}"
        wait_healthy(ctx.shared[f"url_{mode}"], 60, proc)


def floor_teardown(ctx: Context) -> None:
    for mode in ("plain", "db"):
        proc = ctx.shared.pop(f"proc_{mode}", None)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    ctx.shared.clear()


def floor(ctx: Context, run: int) -> tuple[Values, Details]:
    values, details = {}, {}
    for mode in ("plain", "db"):
        proc = ctx.shared[f"proc_{mode}"]
        spec = {"action": "push", "queue": "floor", "clients": 128, "items": 1, "partitions": 128,
                "url": ctx.shared[f"url_{mode}"], "root_pid": proc.pid}  # fmt: skip
        r = ctx.measure(spec, f"-{mode}")
        values[f"{mode}_req_s"] = _rate(r)
        values[f"{mode}_us_per_req"] = r["cpu_cores"].get("broker", 0.0) * 1e6 / max(_rate(r), 1e-9)
        details[mode] = r
        time.sleep(0.2)
    return values, details


def memory(ctx: Context, run: int) -> tuple[Values, Details]:
    if ctx.root_pid is None:
        raise BenchError("no broker pid (an external broker: pass --broker-pid to read its memory)")
    procs = broker_processes(ctx.root_pid)
    ws = workers(procs)
    if not ws:
        raise BenchError(f"no process {ctx.root_pid} to read")
    detail = {"processes": [{"pid": p.pid, "comm": p.comm, "rss_mb": round(p.rss_mb, 1), "peak_mb": round(p.hwm_mb, 1),
                             "worker": p in ws} for p in procs]}  # fmt: skip
    return {"rss_mb": max(p.rss_mb for p in ws), "peak_rss_mb": max(p.hwm_mb for p in ws)}, detail


def _teardown_shared(ctx: Context) -> None:
    for v in list(ctx.shared.values()):
        if isinstance(v, str) and v.startswith("bench-"):
            ctx.delete(v)
    ctx.shared.clear()


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    target_text: str
    metrics: tuple[Metric, ...]
    run: Callable[[Context, int], tuple[Values, Details]]
    setup: Callable[[Context], None] | None = None
    teardown: Callable[[Context], None] | None = None
    single_reading: bool = False  # one reading, not repeated runs (memory)
    peers: tuple[PeerLink, ...] = ()  # ratios to the ``peers`` scenario's figures, judged where targeted


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("push_batch100", "push, 100 items/request, 32 clients", "≥ 0.45× pgmq",
             (Metric("msg_s", "msg/s"),), push_batch, peers=(PeerLink("msg_s", "push_batch100_msg_s", 0.45),)),
    Scenario("push_single", "push, 1 item/request, 128 clients", "≥ 0.72× pgmq",
             (Metric("msg_s", "msg/s"),), push_single, peers=(PeerLink("msg_s", "push_single_msg_s", 0.72),)),
    Scenario("pop_ack", "pop 100 + batch ack, 10 consumers, 10 partitions pre-filled for the window", "≥ 0.75× pgmq",
             (Metric("msg_s", "msg/s"),), pop_ack, peers=(PeerLink("msg_s", "pop_ack_msg_s", 0.75),)),
    Scenario("push_batch100_binary", "binary push (QPB1 flag 8, zstd), 100 items/request, 32 clients",
             "≥ 0.55× pgmq", (Metric("msg_s", "msg/s"),), push_batch_binary,
             peers=(PeerLink("msg_s", "push_batch100_msg_s", 0.55),)),
    Scenario("pop_ack_binary", "framed pop (QPF1) 100 + batch ack, 10 consumers, 10 partitions pre-filled for the "
             "window", "≥ 1.0× pgmq", (Metric("msg_s", "msg/s"),), pop_ack_binary,
             peers=(PeerLink("msg_s", "pop_ack_msg_s", 1.0),)),
    Scenario("latency", "single push, 1 client, sequential", "p50 ≤ 0.8 ms, p99 ≤ 2 ms",
             (Metric("p50_ms", "ms", 0.8, "<=", "p50"), Metric("p99_ms", "ms", 2.0, "<=", "p99")), latency,
             peers=(PeerLink("p50_ms", "latency_p50_ms"), PeerLink("p99_ms", "latency_p99_ms"))),
    Scenario("peers", "pgmq 1.5.1 on the same shapes (asyncpg, throwaway database)", "none (the ratios' peer)",
             PEER_METRICS, peers, peers_setup, peers_teardown),
    Scenario("fanout", "fan-out: 10 consumer groups reading one queue", "≥ 2× the single-group rate",
             (Metric("ratio", "×", 2.0), Metric("single_msg_s", "msg/s"), Metric("fanout_msg_s", "msg/s"),
              Metric("cache_hit_pct", "%")),
             fanout, fanout_setup, _teardown_shared),
    Scenario("partitions_10k", "10,000 partitions, 1 item per push", "≥ 70 % of the 10-partition rate",
             (Metric("pct_of_10", "%", 70.0), Metric("rate_10k_msg_s", "msg/s"), Metric("rate_10_msg_s", "msg/s")),
             partitions, partitions_setup, _teardown_shared),
    Scenario("partition_scale", "pop naming no partition at 1/1k/10k/100k pending partitions; push b=1 at 10k vs 1",
             "pop p50 ≤ 3 ms at 100k; push at 10k ≥ 90 % of 1",
             (Metric("pop_p50_ms_100000", "ms", 3.0, "<=", "pop p50 at 100k"),
              Metric("push_pct_10k_of_1", "%", 90.0, label="push at 10k vs 1"),
              Metric("pop_p50_ms_1", "ms"), Metric("pop_p50_ms_1000", "ms"), Metric("pop_p50_ms_10000", "ms"),
              Metric("pop_sql_p50_ms_1", "ms"), Metric("pop_sql_p50_ms_1000", "ms"),
              Metric("pop_sql_p50_ms_10000", "ms"), Metric("pop_sql_p50_ms_100000", "ms"),
              Metric("pop_broker_us_1", "µs/req"), Metric("pop_pg_us_1", "µs/req"),
              Metric("pop_broker_us_100000", "µs/req"), Metric("pop_pg_us_100000", "µs/req"),
              Metric("push_msg_s_1", "msg/s"), Metric("push_msg_s_10k", "msg/s"),
              Metric("push_broker_us_1", "µs/req"), Metric("push_pg_us_1", "µs/req"),
              Metric("push_broker_us_10k", "µs/req"), Metric("push_pg_us_10k", "µs/req")),
             partition_scale, scale_setup, _teardown_shared),
    Scenario("floor", "floor: bare FastAPI route, 128 clients (plain / + asyncpg SELECT 1)", "none (context)",
             (Metric("plain_us_per_req", "µs/req"), Metric("db_us_per_req", "µs/req"),
              Metric("plain_req_s", "req/s"), Metric("db_req_s", "req/s")), floor, floor_setup, floor_teardown),
    Scenario("memory", "broker memory after the runs", "RSS ≤ 150 MB per worker",
             (Metric("rss_mb", "MB", 150.0, "<="), Metric("peak_rss_mb", "MB")), memory, single_reading=True),
)  # fmt: skip
BY_KEY = {s.key: s for s in SCENARIOS}
