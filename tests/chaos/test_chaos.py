"""Chaos through the proxy: 3 meshed replicas behind HAProxy on one PostgreSQL.

Producers push N messages (distinct transactionIds, retried until answered: a retried push is a
duplicate, never a second message). Two consumer groups pop with leases and settle every batch with
ONE transaction: ack the batch + push one output per input to the group's output queue + a KV write
per input. Meanwhile a supervisor kill -9s a random replica every 5-10 s (and restarts it), and
PostgreSQL is restarted once mid-run. Afterwards: every transactionId reached each group (zero lost),
duplicates counted (each one a batch whose lease was cut by a kill or the restart), each output queue
holds exactly one message per input, the KV holds every input, every cursor is at the end, the DLQ is
empty. The figures are printed (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from tests.conftest import PgServer, free_port, fresh_database
from tests.helpers import until, until_healthy
from tests.replicas import Replica
from tests.test_proxy import haproxy, start_haproxy

N = int(os.environ.get("QUEEN_CHAOS_MESSAGES", "50000"))
PARTITIONS = 8
GROUPS = ("g1", "g2")
CONSUMERS_PER_GROUP = 3
BATCH = 50
PUSH_BATCH = 100


async def test_chaos(pg_server: PgServer, tmp_path: Path) -> None:
    db_url = fresh_database(pg_server)
    exe = haproxy()
    mesh_ports = [free_port() for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{p}" for p in mesh_ports)
    replicas = [
        Replica(db_url, tmp_path, f"r{i}", mesh_port=mesh_ports[i], mesh_peers=peers, mesh_secret="chaos",
                trusted_proxies="127.0.0.1", db_pool_size=6)
        for i in range(3)
    ]  # fmt: skip
    proxy = None
    figures: dict[str, Any] = {"messages": N, "kills": 0, "pg_restarts": 0, "push_retries": 0, "tx_refused": 0}
    delivered: dict[str, dict[str, int]] = {g: {} for g in GROUPS}
    t0 = time.monotonic()
    try:
        await asyncio.gather(*(r.start() for r in replicas))
        proxy, url = start_haproxy(exe, tmp_path, replicas)
        await until_healthy(url, "HAProxy", 20)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            opts = {"leaseTime": 5, "retryLimit": 1000}
            for q in ("chaos-in", *(f"chaos-out-{g}" for g in GROUPS)):
                r = await http.post("/api/v1/configure", json={"queue": q, "options": opts})
                assert r.status_code == 200, r.text

        produced = asyncio.Event()
        stop = asyncio.Event()

        async def call(http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
            """Retried until answered (a killed replica, the database restarting): 5xx, 429, transport."""
            while True:
                try:
                    r = await http.request(method, path, **kw)
                except httpx.HTTPError:
                    figures["push_retries"] += 1
                    await asyncio.sleep(0.05)  # a client's retry pace: a dead replica sends no event to await
                    continue
                if r.status_code >= 500 or r.status_code == 429:
                    figures["push_retries"] += 1
                    await asyncio.sleep(0.1)
                    continue
                return r

        async def producer(k: int, count: int) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for start in range(k * count, (k + 1) * count, PUSH_BATCH):
                    items = [
                        {"queue": "chaos-in", "partition": f"p{i % PARTITIONS}", "transactionId": f"in-{i}",
                         "payload": {"i": i}}
                        for i in range(start, min(start + PUSH_BATCH, (k + 1) * count))
                    ]  # fmt: skip
                    r = await call(http, "POST", "/api/v1/push", json={"items": items})
                    assert r.status_code == 201, r.text

        async def consumer(group: str) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                while not stop.is_set():
                    params = {"wait": "true", "timeout": 1000, "batch": BATCH, "consumerGroup": group}
                    r = await call(http, "GET", "/api/v1/pop/queue/chaos-in", params=params)
                    if r.status_code == 204:
                        continue
                    assert r.status_code == 200, r.text
                    msgs = r.json()["messages"]
                    ops: list[dict[str, Any]] = [
                        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                         "status": "completed", "consumerGroup": group, "leaseId": m["leaseId"]}
                        for m in msgs
                    ]  # fmt: skip
                    outs = [
                        {"queue": f"chaos-out-{group}", "partition": m["partition"],
                         "transactionId": f"{group}-{m['transactionId']}", "payload": m["data"]}
                        for m in msgs
                    ]  # fmt: skip
                    ops.append({"type": "push", "items": outs})
                    kv = [{"op": "put", "ns": f"chaos-{group}", "key": m["transactionId"], "value": m["data"],
                           "forever": True} for m in msgs]  # fmt: skip
                    leases = sorted({m["leaseId"] for m in msgs})
                    body = {"operations": ops, "requiredLeases": leases, "kv": kv}
                    t = await call(http, "POST", "/api/v1/transaction", json=body)
                    seen = delivered[group]
                    for m in msgs:
                        seen[m["transactionId"]] = seen.get(m["transactionId"], 0) + 1
                    if not (t.status_code == 200 and t.json().get("success")):
                        figures["tx_refused"] += 1  # lease cut by a kill/restart: redelivered later

        async def chaos() -> None:
            rng = random.Random()
            restarted_pg = False
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(5, 10))
                if stop.is_set():
                    return
                victim = rng.choice(replicas)
                victim.stop(signal.SIGKILL, timeout=10)
                figures["kills"] += 1
                await victim.start()
                # PostgreSQL restarts once, right after the second kill: mid-run whatever the machine's speed
                if not restarted_pg and figures["kills"] >= 2 and pg_server.embedded is not None:
                    pg_server.embedded.stop()  # returns once PostgreSQL is down
                    pg_server.embedded.start()
                    figures["pg_restarts"] += 1
                    restarted_pg = True

        producers = [asyncio.create_task(producer(k, N // 4)) for k in range(4)]
        consumers = [asyncio.create_task(consumer(g)) for g in GROUPS for _ in range(CONSUMERS_PER_GROUP)]
        monkey = asyncio.create_task(chaos())
        await asyncio.gather(*producers)
        produced.set()
        figures["produce_s"] = round(time.monotonic() - t0, 1)

        async def fetchval(sql: str, *args: Any) -> Any:
            """One query on a fresh connection: the monkey may restart PostgreSQL under a held one."""
            while True:
                try:
                    conn = await asyncpg.connect(db_url)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    await asyncio.sleep(0.2)  # PostgreSQL is restarting
                    continue
                try:
                    return await conn.fetchval(sql, *args)
                except (asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
                    await asyncio.sleep(0.2)
                finally:
                    await conn.close()

        async def drained() -> bool:
            if figures["pg_restarts"] < 1:
                return False  # keep going until PostgreSQL has been restarted under the load once
            lag = await fetchval(
                "SELECT coalesce(sum(p.next_offset - c.cursor_offset), -1) FROM queen.log_consumers c "
                "JOIN queen.log_partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = c.queue_id "
                "WHERE q.name = 'chaos-in'"
            )
            groups = await fetchval(
                "SELECT count(DISTINCT c.consumer_group) FROM queen.log_consumers c "
                "JOIN queen.queues q ON q.id = c.queue_id WHERE q.name = 'chaos-in'"
            )
            return bool(lag == 0 and groups == len(GROUPS))

        await until(drained, "both groups to reach the end of chaos-in", within=240)
        stop.set()
        monkey.cancel()
        await asyncio.gather(monkey, return_exceptions=True)
        await asyncio.gather(*consumers)
        figures["total_s"] = round(time.monotonic() - t0, 1)
        inputs = {f"in-{i}" for i in range(N)}
        for g in GROUPS:
            lost = inputs - set(delivered[g])
            assert not lost, f"{g}: {len(lost)} lost, e.g. {sorted(lost)[:5]}"
            figures[f"{g}_duplicates"] = sum(n - 1 for n in delivered[g].values())
            outs = await fetchval(
                "SELECT sum(p.next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id "
                "WHERE q.name = $1",
                f"chaos-out-{g}",
            )
            assert outs == N, f"{g}: {outs} outputs for {N} inputs"
            kv = await fetchval("SELECT count(*) FROM queen.kv WHERE ns = $1", f"chaos-{g}")
            assert kv == N, f"{g}: {kv} KV rows for {N} inputs"
        assert await fetchval("SELECT count(*) FROM queen.log_dlq") == 0
        stuck = await fetchval(
            "SELECT count(*) FROM queen.log_consumers c JOIN queen.log_partitions p ON p.id = c.partition_id "
            "WHERE c.cursor_offset <> p.next_offset"
        )
        figures["partitions_not_at_end"] = stuck
        assert stuck == 0, f"{stuck} cursors not at the end of their partition"
        assert figures["kills"] >= 2 and figures["pg_restarts"] == 1, figures  # the chaos really happened
        print("\nchaos figures:", figures, flush=True)
        (tmp_path.parent / "chaos-figures.txt").write_text(repr(figures) + "\n")
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for r in replicas:
            r.stop(signal.SIGTERM, timeout=10)
