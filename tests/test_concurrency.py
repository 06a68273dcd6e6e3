"""Concurrency proof: 20 consumers in one group over 50 partitions and 10,000 messages, with random
failures and abandoned batches whose leases expire. Afterwards each message was completed exactly once
or dead-lettered exactly when it exhausted its retries, in partition order, and nothing is lost."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import asyncpg
import httpx

from tests.conftest import Broker

PARTITIONS = 50
PER_PARTITION = 200
TOTAL = PARTITIONS * PER_PARTITION
CONSUMERS = 20
RETRY_LIMIT = 1
P_FAIL = 0.05
P_ABANDON = 0.03


async def test_twenty_consumers_fifty_partitions(start_broker, conn: asyncpg.Connection) -> None:  # type: ignore[no-untyped-def]
    b: Broker = await start_broker(db_pool_size=12, pop_poll_interval_ms=200)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        r = await http.post(
            "/api/v1/configure", json={"queue": "cc", "options": {"leaseTime": 1, "retryLimit": RETRY_LIMIT}}
        )
        assert r.status_code == 200
        for p in range(PARTITIONS):
            for start in range(0, PER_PARTITION, 100):
                items = [
                    {"queue": "cc", "partition": f"p{p}", "transactionId": f"p{p}-{i}", "payload": {"p": p, "i": i}}
                    for i in range(start, start + 100)
                ]
                assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201

    completed: dict[str, int] = defaultdict(int)  # accepted, non-noop completions per message
    failures: dict[str, int] = defaultdict(int)  # accepted failed acks per message
    dead: set[str] = set()  # acks the broker reported as dead-lettering
    deliveries: dict[int, list[list[int]]] = defaultdict(list)  # per partition, each delivery's offsets
    abandoned = 0
    done = asyncio.Event()

    def settle() -> None:
        if len(completed) + len(dead) >= TOTAL:
            done.set()

    async def consumer(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
            while not done.is_set():
                r = await http.get(
                    "/api/v1/pop/queue/cc",
                    params={"consumerGroup": "workers", "batch": 25, "wait": "true", "timeout": 500},
                )
                if r.status_code == 204:
                    continue
                msgs = r.json()["messages"]
                # recorded before the ack: the lease orders deliveries of a partition in real time
                deliveries[msgs[0]["data"]["p"]].append([m["data"]["i"] for m in msgs])
                if rng.random() < P_ABANDON:
                    nonlocal abandoned
                    abandoned += 1
                    continue  # crash: the lease expires and the batch comes back
                acks, marks = [], []
                for m in msgs:
                    status = "failed" if rng.random() < P_FAIL else "completed"
                    acks.append(
                        {
                            "transactionId": m["transactionId"],
                            "partitionId": m["partitionId"],
                            "leaseId": m["leaseId"],
                            "status": status,
                            "error": "boom",
                        }
                    )
                    marks.append((m, status))
                    if status == "failed":
                        break  # the rest of the partition comes back after the nack
                res = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": "workers"})
                assert res.status_code == 200
                for (m, status), item in zip(marks, res.json(), strict=True):
                    if not item["success"] or item["noop"]:
                        continue
                    txn = m["transactionId"]
                    if status == "failed":
                        failures[txn] += 1
                    else:
                        completed[txn] += 1
                    if item["dlq"]:
                        dead.add(txn)
                    if status == "completed" or item["dlq"]:
                        settle()

    tasks = [asyncio.create_task(consumer(seed)) for seed in range(CONSUMERS)]
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    everything = {f"p{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION)}
    # dead letters are exactly the messages that failed more than retryLimit times
    exhausted = {t for t, n in failures.items() if n > RETRY_LIMIT}
    assert dead == exhausted
    assert all(n <= RETRY_LIMIT + 1 for n in failures.values())
    # every other message was completed exactly once; nothing lost, nothing invented
    assert set(completed) == everything - dead
    assert all(n == 1 for n in completed.values())
    assert set(completed) | dead == everything
    # per-partition order held: each delivery is a contiguous ascending run that starts where the
    # previous one left the partition (never behind it), and the last one reached the end
    assert sorted(deliveries) == list(range(PARTITIONS))
    for p, runs in deliveries.items():
        for run in runs:
            assert run == list(range(run[0], run[0] + len(run))), f"p{p}: delivery {run} not in order"
        starts = [run[0] for run in runs]
        assert starts == sorted(starts) and starts[0] == 0, f"p{p}: a delivery went back: {starts}"
        assert max(run[-1] for run in runs) == PER_PARTITION - 1
    # and the database agrees
    rows = await conn.fetch("SELECT transaction_id FROM queen.log_dlq")
    assert {r["transaction_id"] for r in rows} == dead
    cursors = await conn.fetch("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'workers'")
    assert [r["cursor_offset"] for r in cursors] == [PER_PARTITION] * PARTITIONS
    # the run did exercise retries, dead letters and lease expiries
    assert len(dead) > 0 and sum(failures.values()) > len(dead) and abandoned > 0
