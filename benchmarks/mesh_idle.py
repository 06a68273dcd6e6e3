"""Idle long-polls and the cross-replica wake (``make bench-mesh``).

Two replicas on one embedded PostgreSQL, meshed: A (``BrokerProcess``, owns the database) and B
(``queen-pg serve --database-url`` of A's). Then:

1. idle: 2,000 long-poll pops (timeout 30 s, re-issued on 204) parked on B over 100 empty queues (20
   per queue, queue mode); over a window: B's and A's CPU (share of one core) and PostgreSQL
   transactions per second (pg_stat_database xact_commit + xact_rollback delta of the database).
2. local delivery: a push through B to one of those queues; the time from sending the push to the
   first pop answer (50 trials), and as a control the same push to a queue nobody is parked on.
   Consumers and pushes use the raw HTTP/1.1 client (``benchmarks/httpclient.py``), one connection
   per consumer: httpx's pool scans every connection per request, and with 2,000 of them it kept this
   process busy for minutes whenever the pops timed out together (they were then not parked on B).
   ``--profile DIR`` records B with py-spy during the idle window and a second round of pushes.
3. cross-replica wake: one pop parked on B, a push through A (1,000 trials): push sent -> pop answered
   ("delivery"), push sent -> push answered, and push answered -> pop answered ("wake", what the mesh
   adds after the push committed; negative when the woken pop's answer beat the push's own).

Targets: CPU <= 5 % of a core, <= 50 xact/s, local delivery p50 <= 10 ms; wake p50 <= 5 ms, p99 <= 20 ms.
Writes ``benchmarks/results/<date>-<commit>-mesh.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import asyncpg
import httpx

from benchmarks.broker import BrokerProcess, free_port, wait_healthy
from benchmarks.httpclient import Conn, HttpError, raw_request
from benchmarks.machine import ROOT, machine_info, result_path
from benchmarks.procstat import TICK, _all_stats, machine_cpu, tree_cpu
from benchmarks.profiling import Profiler

SECRET = "bench-mesh"


def cpu_seconds(pid: int) -> float:
    return _all_stats()[pid][2] / TICK


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def xacts(dsn: str) -> int:
    c = await asyncpg.connect(dsn)
    try:
        return int(
            await c.fetchval(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await c.close()


LONG_POLL: dict[str, str | int] = {"wait": "true", "timeout": 30_000, "autoAck": "true"}


class Got:
    """Times at which consumers received a message; ``arrived`` is set at each."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.arrived = asyncio.Event()
        self.answers: Counter[str] = Counter()  # status codes and transport errors of the consumers

    def add(self) -> None:
        self.times.append(time.perf_counter())
        self.arrived.set()


def push_request(queue: str, payload: int) -> bytes:
    return raw_request("POST", "/api/v1/push", json.dumps({"items": [{"queue": queue, "payload": payload}]}).encode())


async def consumer(host: str, port: int, queue: str, stop: asyncio.Event, got: Got) -> None:
    """One long-poll consumer on its own keep-alive connection (the raw client: httpx's pool scans
    every connection per request, which with 2,000 of them kept this process busy for minutes each
    time the pops timed out together, so they were not parked while the window measured B)."""
    conn = Conn(host, port)
    raw = raw_request("GET", f"/api/v1/pop/queue/{queue}?{urlencode(LONG_POLL)}")
    try:
        while not stop.is_set():
            try:
                status, _ = await conn.request(raw)
            except HttpError as exc:  # a keep-alive connection the server closed as we reused it
                got.answers[str(exc).split(":")[0]] += 1
                await asyncio.sleep(0.1)
                continue
            got.answers[str(status)] += 1
            if status == 200:
                got.add()
            elif status in (429, 503):  # the start-up burst: 2,000 first claims at once
                await asyncio.sleep(1)
    finally:
        conn.close()


async def measure(a_url: str, b_url: str, a_pid: int, b_pid: int, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(args.queues):
            await http.post(f"{a_url}/api/v1/configure", json={"queue": f"idle{i}"})
        await http.post(f"{a_url}/api/v1/configure", json={"queue": "wake"})
    stop = asyncio.Event()
    got = Got()
    b = urlsplit(b_url)
    assert b.hostname is not None and b.port is not None
    consumers = [
        asyncio.create_task(consumer(b.hostname, b.port, f"idle{i % args.queues}", stop, got)) for i in range(args.pops)
    ]
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            parked = (await http.get(f"{b_url}/api/v1/analytics/system-metrics")).json()["longPoll"]["parked"]
            if parked >= args.pops:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.settle)  # the first probes back off
        prof = Profiler(b_pid, args.profile) if args.profile is not None else None
        with prof.record("idle") if prof is not None else contextlib.nullcontext():
            x0, ca0, cb0, t0 = await xacts(dsn), cpu_seconds(a_pid), cpu_seconds(b_pid), time.monotonic()
            pg0, m0 = tree_cpu(a_pid)["postgres"], machine_cpu()["procs"]
            await asyncio.sleep(args.window)
            x1, ca1, cb1, t1 = await xacts(dsn), cpu_seconds(a_pid), cpu_seconds(b_pid), time.monotonic()
            pg1, m1 = tree_cpu(a_pid)["postgres"], machine_cpu()["procs"]
        wall = t1 - t0
        out["idle"] = {
            "parked": args.pops,
            "queues": args.queues,
            "window_s": round(wall, 1),
            "broker_b_cpu_pct": round(100 * (cb1 - cb0) / wall, 2),
            "broker_a_cpu_pct": round(100 * (ca1 - ca0) / wall, 2),
            "broker_b_cpu_s_per_s": round((cb1 - cb0) / wall, 4),  # from /proc: what the target is about
            "postgres_cpu_pct": round(100 * (pg1 - pg0) / wall, 2),  # the whole database (A's jobs too)
            "machine_busy_cores": round((m1 - m0) / wall, 2),  # everything on the machine: how loaded it was
            "db_xact_s": round((x1 - x0) / wall, 1),
            "consumer_answers": dict(got.answers),
        }
        print("idle:", out["idle"], flush=True)
        # local delivery: push through B to a queue with 20 pops parked on B
        local: list[float] = []
        local_after: list[float] = []
        pushed_local: list[float] = []
        pushed_control: list[float] = []
        pusher = Conn(b.hostname, b.port)  # the raw client: what a push costs the broker, not httpx
        cb2 = cpu_seconds(b_pid)
        for i in range(args.local_trials):
            await asyncio.sleep(0.2)
            n = len(got.times)
            got.arrived.clear()
            t = time.perf_counter()
            status, body = await pusher.request(push_request(f"idle{i}", i))
            t_pushed = time.perf_counter()
            assert status == 201, body
            await asyncio.wait_for(got.arrived.wait(), 30)
            local.append((got.times[n] - t) * 1000)
            local_after.append(max(0.0, (got.times[n] - t_pushed) * 1000))
            pushed_local.append((t_pushed - t) * 1000)
            await asyncio.sleep(0.05)
            t = time.perf_counter()  # the control: the same push to a queue nobody is parked on
            status, body = await pusher.request(push_request("wake", i))
            assert status == 201, body
            pushed_control.append((time.perf_counter() - t) * 1000)
        pusher.close()
        cb3 = cpu_seconds(b_pid)
        out["local_delivery_ms"] = {
            "trials": len(local),
            "p50": round(statistics.median(local), 2),
            "p99": round(pct(local, 99), 2),
            "max": round(max(local), 2),
            "after_push_answered_p50": round(statistics.median(local_after), 2),
            "push_answered_p50": round(statistics.median(pushed_local), 2),
            "push_answered_no_pops_p50": round(statistics.median(pushed_control), 2),
            "broker_b_cpu_ms_per_push": round(1000 * (cb3 - cb2) / len(local), 2),  # delivery, control push included
        }
        if prof is not None:  # the pushes again, profiled (not quoted: py-spy's sampling slows B)
            with prof.record("local"):
                for i in range(args.local_trials):
                    await asyncio.sleep(0.2)
                    got.arrived.clear()
                    await http.post(f"{b_url}/api/v1/push", json={"items": [{"queue": f"idle{i}", "payload": i}]})
                    await asyncio.wait_for(got.arrived.wait(), 30)
            out["profile"] = prof.summaries
        print("local delivery:", out["local_delivery_ms"], flush=True)
    if args.trials > 0:
        out["cross_replica"] = await cross_replica(a_url, b_url, args)
    stop.set()
    for c in consumers:
        c.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    return out


async def cross_replica(a_url: str, b_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One pop parked on B, the push through A, ``args.trials`` times."""
    delivery: list[float] = []
    wake: list[float] = []
    pushed: list[float] = []
    one: dict[str, str | int] = {"wait": "true", "timeout": 10_000, "autoAck": "true"}
    async with httpx.AsyncClient(base_url=b_url, timeout=30) as pb, httpx.AsyncClient(base_url=a_url, timeout=30) as pa:
        errors = 0
        for i in range(args.trials):
            pop = asyncio.create_task(pb.get("/api/v1/pop/queue/wake", params=one))
            await asyncio.sleep(0.02)  # parked by then (a bench, not a test)
            t = time.perf_counter()
            try:
                r = await pa.post("/api/v1/push", json={"items": [{"queue": "wake", "payload": i}]})
                t_pushed = time.perf_counter()
                res = await pop
            except httpx.TransportError:  # a keep-alive connection closed as it was reused: not a sample
                errors += 1
                await asyncio.gather(pop, return_exceptions=True)
                continue
            t_got = time.perf_counter()
            assert r.status_code == 201 and res.status_code == 200, (r.status_code, res.status_code)
            delivery.append((t_got - t) * 1000)
            pushed.append((t_pushed - t) * 1000)
            wake.append((t_got - t_pushed) * 1000)  # < 0: the woken pop answered before the push did
    figures: dict[str, Any] = {
        "trials": len(wake),
        "transport_errors": errors,
        "delivery_ms": {"p50": round(statistics.median(delivery), 2), "p99": round(pct(delivery, 99), 2)},
        "push_answered_ms": {"p50": round(statistics.median(pushed), 2), "p99": round(pct(pushed, 99), 2)},
        "wake_ms": {
            "p50": round(statistics.median(wake), 2),
            "p99": round(pct(wake, 99), 2),
            "max": round(max(wake), 2),
        },
    }
    print("cross replica:", figures, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pops", type=int, default=2000)
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=15.0)
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--local-trials", type=int, default=50)
    p.add_argument("--profile", type=Path, default=None, help="py-spy replica B (idle window, pushes) into this dir")
    p.add_argument("--output", type=Path, help="[benchmarks/results/<date>-<commit>-mesh.json]")
    p.add_argument("--b-log", type=Path, default=Path("/tmp/queen-bench-replica-b.log"), help="replica B log")
    args = p.parse_args(argv)
    output = args.output or result_path("mesh")
    pa, pb = free_port(), free_port()
    peers = f"127.0.0.1:{pa},127.0.0.1:{pb}"
    mesh = {"QUEEN_MESH_PEERS": peers, "QUEEN_MESH_SECRET": SECRET}
    a = BrokerProcess(env=mesh | {"QUEEN_MESH_PORT": str(pa)})
    a.start()
    b_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")} | mesh
    env |= {"QUEEN_MESH_PORT": str(pb), "DATABASE_URL": a.pg_dsn(), "QUEEN_MAX_WAITERS": str(args.pops + 100)}
    b_log = open(args.b_log, "wb")
    cmd = [
        sys.executable,
        "-m",
        "queen_pg.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(b_port),
    ]
    b = subprocess.Popen([*cmd, "--log-level", "warning"], cwd=ROOT, env=env, stdout=b_log, stderr=b_log)
    try:
        b_url = f"http://127.0.0.1:{b_port}"
        wait_healthy(b_url, 60, b)
        out = asyncio.run(measure(a.url, b_url, a.pid, b.pid, a.pg_dsn(), args))
        out["setup"] = {"replicas": 2, "pops_on": "B", "pop_poll_interval_ms": 1000, "pop_poll_max_ms": 10000,
                        "gc_thresholds": "10000,10,100", "client": "raw HTTP/1.1, one connection per consumer",
                        "cpu": os.cpu_count()}  # fmt: skip
        out["machine"] = machine_info()  # the commit and the machine this run measured
        output.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {output}")
    finally:
        b.send_signal(signal.SIGTERM)
        b.wait(30)
        b_log.close()
        a.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
