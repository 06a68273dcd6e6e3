"""PostgreSQL CPU per ``queen.pop_v1`` and per ``queen.ack_v3`` call, measured on their backends.

Starts ``queen-pg serve`` (embedded PostgreSQL), fills a queue over HTTP (10 partitions), then pops
100 at a time on one connection and acks each batch (one ack_v3 call) on another; each backend's CPU
comes from /proc/<backend pid>/stat. Usage: ``python -m benchmarks.popack_sql [messages]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
import uuid

import asyncpg

from benchmarks.broker import BrokerProcess
from benchmarks.procstat import TICK
from queen_pg.engine import codec
from queen_pg.engine.ack import ACK_SQL, Packed
from queen_pg.engine.leases import LeaseBook
from queen_pg.engine.pop import POP_SQL, QUEUE_MODE

HINT = os.environ.get("POPACK_HINT", "1") == "1"  # 0: ack without the lease book's hint


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        s = f.read()
    fields = s[s.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _fill(url: str, queue: str, total: int) -> None:
    for start in range(0, total, 100):
        items = [{"queue": queue, "partition": f"p{(start // 100) % 10}", "payload": {"i": start + i}}
                 for i in range(100)]  # fmt: skip
        req = urllib.request.Request(url + "/api/v1/push", json.dumps({"items": items}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(req, timeout=60).read()


async def _run(dsn: str, queue: str, total: int, max_pops: int = 0) -> dict[str, float]:
    popc = await asyncpg.connect(dsn)
    ackc = await asyncpg.connect(dsn)
    pop_pid = await popc.fetchval("SELECT pg_backend_pid()")
    ack_pid = await ackc.fetchval("SELECT pg_backend_pid()")
    pops = acks = msgs = 0
    pop_t = ack_t = 0
    wall = time.perf_counter()
    while pops != max_pops or not max_pops:
        lease = uuid.uuid4()
        t0 = _ticks(pop_pid)
        rows = await popc.fetch(POP_SQL, "default", queue, None, None, None, QUEUE_MODE, 100, 1, lease, False,
                                None, None, None)  # fmt: skip
        pop_t += _ticks(pop_pid) - t0
        pops += 1
        if not rows:
            break
        pack = Packed()
        for row in rows:
            lo, hi = max(row["lease_start"], row["base_offset"]), min(row["lease_end"], row["end_offset"])
            for k, fr in enumerate(codec.unpack(row["payload"], row["codec"])):
                if lo <= row["base_offset"] + k < hi:
                    pack.add(row["partition_id"], fr.transaction_id, lease, QUEUE_MODE, "completed", None)
                    msgs += 1
        t0 = _ticks(ack_pid)
        book = LeaseBook()
        if HINT:
            book.remember(lease, rows)
        res = await ackc.fetch(ACK_SQL, "default", *pack.args(), pack.hint(book) if HINT else None)
        ack_t += _ticks(ack_pid) - t0
        acks += 1
        assert not res[0]["o_refused"], res
    wall = time.perf_counter() - wall
    await popc.close()
    await ackc.close()
    us = 1e6 / TICK
    return {"messages": msgs, "pops": pops, "acks": acks, "wall_s": round(wall, 2),
            "pg_us_per_pop": round(pop_t * us / max(pops, 1), 1), "pg_us_per_ack": round(ack_t * us / max(acks, 1), 1),
            "pg_us_per_msg": round((pop_t + ack_t) * us / max(msgs, 1), 2)}  # fmt: skip


def main() -> None:
    if len(sys.argv) > 2:  # against a running database: python -m benchmarks.popack_sql DSN QUEUE POPS
        print(json.dumps(asyncio.run(_run(sys.argv[1], sys.argv[2], 0, int(sys.argv[3])))))
        return
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with BrokerProcess(workers=1) as broker:
        q = "sqlbench"
        _fill(broker.url, q, total)
        print(json.dumps(asyncio.run(_run(broker.pg_dsn(), q, total))))


if __name__ == "__main__":
    main()
