"""Chaos on the database (``make chaos-ha``, QUEEN_HA=1): the cluster of ``make ha`` under load loses its
primary three ways, one after the other, each once every replica streams again: a ``patronictl
switchover``, a kill -9 of the primary's postmaster, and a kill -9 of the primary's Patroni and postmaster
together (a machine lost: the leader key expires after ``ttl``; run.py starts that node again later and
it rejoins by pg_rewind).

Producers push distinct transactionIds through HAProxy, each push retried until answered (a retried
push that had committed is a duplicate, never a second message); a consumer group pops with leases and
settles each batch with one transaction (ack + one output per input). Afterwards: every input reached
the group (zero lost), the output queue holds exactly one message per input, the DLQ is empty, and no
answer was a 500. Printed (run with -s): per fault, the longest time without an acknowledged push.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.ha.harness import cluster, leader, patroni_pid, postmaster_pid, settled
from tests.helpers import until

BASE_PORT = int(os.environ.get("QUEEN_HA_BASE_PORT", "25400")) + 100  # clear of the smoke test's
MIN_MESSAGES = int(os.environ.get("QUEEN_HA_CHAOS_MESSAGES", "3000"))
PARTITIONS = 4
PUSH_BATCH = 20
BATCH = 50
CONSUMERS = 2


@pytest.mark.timeout(900)
@pytest.mark.parametrize("db", ["multi-host", "via-proxy"])
async def test_chaos_on_the_database(tmp_path: Path, patroni_venv: Path, db: str) -> None:
    """``db``: how the brokers reach the primary (a multi-host URL, or HAProxy's door to the primary,
    where a promotion shows as read-only answers: 25006)."""
    figures: dict[str, Any] = {"db": db}
    statuses: Counter[int] = Counter()
    async with cluster(tmp_path / "ha", patroni_venv, BASE_PORT, "--restart-after", "25", "--db", db) as ready:
        state: Path = ready["state"]
        rest: list[str] = ready["rest"]
        url = ready["front"]
        figures["cluster_ready_s"] = round(time.monotonic() - ready["t0"], 1)
        async with httpx.AsyncClient(base_url=url, timeout=70) as http:
            for q in ("hac-in", "hac-out"):
                r = await http.post("/api/v1/configure", json={"queue": q, "options": {"leaseTime": 10}})
                assert r.status_code == 200, r.text

        faults_done = asyncio.Event()
        stop = asyncio.Event()
        produced: list[str] = []
        acked_at: list[float] = []
        delivered: Counter[str] = Counter()

        async def call(http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
            """Retried until answered: 503 (the database failing over), 429, a transport error."""
            while True:
                try:
                    r = await http.request(method, path, **kw)
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)  # a client's retry pace: a failover sends no event to await
                    continue
                statuses[r.status_code] += 1
                if r.status_code in (429, 503):
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")) / 4)
                    continue
                return r

        async def producer(k: int) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=70) as http:
                n = 0
                while not faults_done.is_set() or n * 2 < MIN_MESSAGES:
                    items: list[dict[str, Any]] = [
                        {"queue": "hac-in", "partition": f"p{(n + i) % PARTITIONS}",
                         "transactionId": f"in-{k}-{n + i}", "payload": {"k": k, "n": n + i}}
                        for i in range(PUSH_BATCH)
                    ]  # fmt: skip
                    r = await call(http, "POST", "/api/v1/push", json={"items": items})
                    assert r.status_code == 201, r.text
                    produced.extend(it["transactionId"] for it in items)
                    acked_at.append(time.monotonic())
                    n += PUSH_BATCH

        async def consumer() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=70) as http:
                while not stop.is_set():
                    params = {"wait": "true", "timeout": 1000, "batch": BATCH, "consumerGroup": "g"}
                    r = await call(http, "GET", "/api/v1/pop/queue/hac-in", params=params)
                    if r.status_code == 204:
                        continue
                    assert r.status_code == 200, r.text
                    msgs = r.json()["messages"]
                    ops: list[dict[str, Any]] = [
                        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                         "status": "completed", "consumerGroup": "g", "leaseId": m["leaseId"]}
                        for m in msgs
                    ]  # fmt: skip
                    outs = [
                        {"queue": "hac-out", "partition": m["partition"], "transactionId": f"out-{m['transactionId']}",
                         "payload": m["data"]}
                        for m in msgs
                    ]  # fmt: skip
                    ops.append({"type": "push", "items": outs})
                    body = {"operations": ops, "requiredLeases": sorted({m["leaseId"] for m in msgs})}
                    await call(http, "POST", "/api/v1/transaction", json=body)
                    for m in msgs:
                        delivered[m["transactionId"]] += 1

        async def fault(name: str, act: Any) -> None:
            await until(lambda: settled(rest), f"every replica streaming before the {name}", within=120)
            old = await leader(rest)
            assert old is not None
            t = time.monotonic()
            await act(old)

            async def moved() -> bool:
                new = await leader(rest)
                return new is not None and new != old

            await until(moved, f"a new leader after the {name}", within=90)
            mark = len(acked_at)
            await until(lambda: asyncio.sleep(0, len(acked_at) > mark + 2), f"pushes after the {name}", 60)
            during = [t, *(a for a in acked_at if a >= t)]
            figures[name] = {
                "old_leader": old, "new_leader": await leader(rest),
                "longest_gap_s": round(max(b - a for a, b in itertools.pairwise(during)), 2),
            }  # fmt: skip

        async def switchover(old: str) -> None:
            cmd = [*ready["patronictl"], "switchover", "--force"]
            sw = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
            assert sw.returncode == 0, sw.stdout + sw.stderr

        async def kill_postmaster(old: str) -> None:
            os.kill(postmaster_pid(state, old), signal.SIGKILL)

        async def lose_machine(old: str) -> None:
            patroni, postmaster = patroni_pid(state, old), postmaster_pid(state, old)
            os.kill(patroni, signal.SIGKILL)
            os.kill(postmaster, signal.SIGKILL)

        producers = [asyncio.create_task(producer(k)) for k in range(2)]
        consumers = [asyncio.create_task(consumer()) for _ in range(CONSUMERS)]
        await until(lambda: asyncio.sleep(0, len(acked_at) > 5), "the first pushes", within=30)
        await fault("switchover", switchover)
        await fault("postmaster_kill", kill_postmaster)
        await fault("machine_loss", lose_machine)
        await until(lambda: settled(rest), "the lost node back, streaming (run.py restarts it)", within=180)
        faults_done.set()
        await asyncio.gather(*producers)
        figures["produced"] = len(produced)

        async def fetchval(sql: str, *args: Any) -> Any:
            conn = await asyncpg.connect(ready["database_url"])
            try:
                return await conn.fetchval(sql, *args)
            finally:
                await conn.close()

        async def drained() -> bool:
            lag = await fetchval(
                "SELECT coalesce(sum(p.next_offset - c.cursor_offset), -1) FROM queen.log_consumers c "
                "JOIN queen.log_partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = c.queue_id "
                "WHERE q.name = 'hac-in'"
            )
            return bool(lag == 0)

        await until(drained, "the group to reach the end of hac-in", within=120)
        stop.set()
        await asyncio.gather(*consumers)

        lost = set(produced) - set(delivered)
        assert not lost, f"{len(lost)} lost, e.g. {sorted(lost)[:5]}"
        assert await fetchval("SELECT sum(next_offset) FROM queen.log_partitions p JOIN queen.queues q "
                              "ON q.id = p.queue_id WHERE q.name = 'hac-in'") == len(set(produced))  # fmt: skip
        assert await fetchval("SELECT sum(next_offset) FROM queen.log_partitions p JOIN queen.queues q "
                              "ON q.id = p.queue_id WHERE q.name = 'hac-out'") == len(set(produced))  # fmt: skip
        assert await fetchval("SELECT count(*) FROM queen.log_dlq") == 0
        figures["duplicates"] = sum(n - 1 for n in delivered.values())
        figures["answers"] = dict(statuses)
        assert 500 not in statuses, statuses
    figures["total_s"] = round(time.monotonic() - ready["t0"], 1)
    print("\nchaos-ha:", json.dumps(figures))
