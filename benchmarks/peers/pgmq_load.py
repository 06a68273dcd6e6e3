"""The load generator of the pgmq peer: a separate process that drives pgmq over asyncpg, on the shapes
of ``benchmarks/loadgen.py``, and prints one JSON result.

    python -m benchmarks.peers.pgmq_load '<json spec>'      (from the repository root)

``spec["dsn"]`` names the throwaway database holding pgmq; ``spec["max_conns"]`` bounds the connections
(the embedded server's ``max_connections`` is shared with the idle broker's pools): ``clients`` callers
share a pool of ``min(clients, max_conns)`` connections, each call taking one. Actions:

- ``push``: ``clients`` callers loop ``pgmq.send_batch(queue, <items> payloads)`` (``items`` > 1) or
  ``pgmq.send(queue, payload)``; rate = messages sent per second in the window.
- ``latency``: ``push`` with one caller and one item, sequential: p50/p99 of ``pgmq.send``.
- ``consume``: ``consumers`` callers loop ``pgmq.read(queue, vt, batch)`` + ``pgmq.delete(queue, ids)``
  and decode every message; rate = deleted messages per second. ``expect`` ends the window early when
  all are deleted (reported as ``ran_dry``).
- ``fill``: ``total`` messages by ``send_batch`` of ``per_req`` (not timed; ``create`` the queue first).

The payload is the same JSON as our scenarios' (``payload_json``); with ``root_pid`` the window's CPU is
read from /proc as ours is (``broker`` is then the idle broker's, ``postgres`` pgmq's server side).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import asyncpg
import orjson

from benchmarks.loadgen import Meter, latency_summary, measured, payload_json, run_spec

SEND = "SELECT pgmq.send($1, $2::jsonb)"
SEND_BATCH = "SELECT pgmq.send_batch($1, $2::jsonb[])"
READ = "SELECT msg_id, message FROM pgmq.read($1, $2, $3)"
DELETE = "SELECT pgmq.delete($1, $2::bigint[])"
VT_S = 30  # visibility timeout of a read: far longer than a read + delete takes


async def pool_for(spec: dict[str, Any], callers: int) -> asyncpg.Pool:
    n = max(1, min(callers, int(spec.get("max_conns", callers))))
    spec["_connections"] = n
    return await asyncpg.create_pool(spec["dsn"], min_size=n, max_size=n)


async def push_caller(pool: asyncpg.Pool, spec: dict[str, Any], meter: Meter) -> None:
    queue, items = spec["queue"], spec["items"]
    payload = payload_json(spec.get("payload_bytes", 128)).decode()
    sql, arg = (SEND_BATCH, [payload] * items) if items > 1 else (SEND, payload)
    while not meter.stop:
        t0 = time.perf_counter_ns()
        try:
            async with pool.acquire() as conn:
                await conn.fetch(sql, queue, arg)
        except (asyncpg.PostgresError, OSError) as exc:
            meter.error(str(exc))
            await asyncio.sleep(0.05)
            continue
        meter.reqs += 1
        meter.count += items
        if meter.latencies is not None and meter.measuring:
            meter.latencies.append(time.perf_counter_ns() - t0)


async def run_push(spec: dict[str, Any]) -> dict[str, Any]:
    meter = Meter()
    meter.latencies = []
    pool = await pool_for(spec, spec["clients"])
    tasks = [asyncio.create_task(push_caller(pool, spec, meter)) for _ in range(spec["clients"])]
    out = await measured(spec, meter, tasks, None)
    out["latency_ms"] = latency_summary(meter.latencies)
    out["connections"] = spec["_connections"]
    await pool.close()
    return out


async def consume_caller(
    pool: asyncpg.Pool, spec: dict[str, Any], meter: Meter, drained: asyncio.Event, deleted: list[int]
) -> None:
    queue, batch, expect = spec["queue"], spec["batch"], spec.get("expect", 0)
    while not meter.stop:
        if expect and deleted[0] >= expect:
            return
        try:
            async with pool.acquire() as conn:
                rows = await conn.fetch(READ, queue, VT_S, batch)
                meter.reqs += 1
                if not rows:
                    await asyncio.sleep(0.002)  # every visible message is read by a sibling, or none is left
                    continue
                for row in rows:  # what a consumer does with a message: decode it
                    orjson.loads(row["message"])
                gone = await conn.fetch(DELETE, queue, [row["msg_id"] for row in rows])
                meter.reqs += 1
        except (asyncpg.PostgresError, OSError) as exc:
            meter.error(str(exc))
            await asyncio.sleep(0.05)
            continue
        if len(gone) != len(rows):
            meter.error(f"delete removed {len(gone)} of {len(rows)} messages read")
        meter.count += len(gone)
        deleted[0] += len(gone)
        if expect and deleted[0] >= expect:
            drained.set()


async def run_consume(spec: dict[str, Any]) -> dict[str, Any]:
    meter = Meter()
    pool = await pool_for(spec, spec["consumers"])
    drained = asyncio.Event()
    deleted = [0]
    tasks = [asyncio.create_task(consume_caller(pool, spec, meter, drained, deleted)) for _ in range(spec["consumers"])]
    out = await measured(spec, meter, tasks, drained if spec.get("expect") else None)
    out["per_group"] = [deleted[0]]
    out["left_per_group"] = [max(0, spec.get("expect", 0) - deleted[0])]
    out["connections"] = spec["_connections"]
    await pool.close()
    return out


async def run_fill(spec: dict[str, Any]) -> dict[str, Any]:
    payload = payload_json(spec.get("payload_bytes", 128)).decode()
    total, per_req = spec["total"], spec["per_req"]
    sizes = [min(per_req, total - i) for i in range(0, total, per_req)]
    sent, errors = 0, []
    t0 = time.monotonic()
    pool = await pool_for(spec, spec.get("concurrency", 10))

    async def worker() -> None:
        nonlocal sent
        while sizes:
            n = sizes.pop()
            try:
                async with pool.acquire() as conn:
                    ids = await conn.fetch(SEND_BATCH, spec["queue"], [payload] * n)
                sent += len(ids)  # not `sent += len(await ...)`: that reads `sent` before the await
            except (asyncpg.PostgresError, OSError) as exc:
                errors.append(str(exc)[:300])
                return

    await asyncio.gather(*(worker() for _ in range(spec["_connections"])))
    await pool.close()
    return {"count": sent, "elapsed_s": round(time.monotonic() - t0, 3), "errors": len(errors),
            "first_error": errors[0] if errors else None}  # fmt: skip


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    action = spec["action"]
    if action == "push":
        return await run_push(spec)
    if action == "latency":
        return await run_push({**spec, "clients": 1, "items": 1})
    if action == "consume":
        return await run_consume(spec)
    if action == "fill":
        return await run_fill(spec)
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    sys.exit(run_spec(sys.argv, main_async))
