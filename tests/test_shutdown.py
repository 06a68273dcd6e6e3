"""SIGTERM on a real `queen-pg serve` process: every parked long-poll pop is answered 204 at once
(they were parked for 600 s), a call in flight finishes, the process exits within 5 s, and one log
line says what was drained."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import asyncpg
import httpx

from tests.helpers import until
from tests.serve_process import ServeProcess

PARKED = 300
QUEUES = 10


async def parked(http: httpx.AsyncClient) -> int:
    r = await http.get("/api/v1/analytics/system-metrics")
    return int(r.json()["longPoll"]["parked"])


async def test_sigterm_answers_parked_pops_at_once_lets_calls_finish_and_exits_fast(
    db_url: str, tmp_path: Path, conn: asyncpg.Connection
) -> None:
    # no re-poll while parked: every pop stays parked until the drain
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_POP_POLL_INTERVAL_MS="60000")
    await broker.start()
    watcher = await asyncpg.connect(db_url)
    limits = httpx.Limits(max_connections=PARKED + 20, max_keepalive_connections=PARKED + 20)
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=700, limits=limits) as http:
            for q in range(QUEUES):  # the queues exist, empty: every pop parks
                r = await http.post("/api/v1/push", json={"items": [{"queue": f"sq{q}", "payload": 0}]})
                assert r.status_code == 201
                r = await http.get(f"/api/v1/pop/queue/sq{q}", params={"autoAck": "true"})
                assert r.status_code == 200
            pops = [
                asyncio.create_task(
                    http.get(f"/api/v1/pop/queue/sq{i % QUEUES}", params={"wait": "true", "timeout": 600_000})
                )
                for i in range(PARKED)
            ]

            async def all_parked() -> bool:
                return await parked(http) == PARKED

            await until(all_parked, f"{PARKED} pops to park", within=60)

            # a call in flight at SIGTERM: a push waiting for its partition's write lock
            pid = await conn.fetchval(
                "SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'sq0'"
            )
            tx = conn.transaction()
            await tx.start()
            await conn.execute("SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR UPDATE", pid)
            in_flight = asyncio.create_task(
                http.post("/api/v1/push", json={"items": [{"queue": "sq0", "payload": "late"}]})
            )

            async def push_waits() -> bool:  # asked on another connection: conn's transaction would cache it
                n = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%push%'"
                    " AND datname = current_database()"
                )
                return bool(n)

            await until(push_waits, "the push to wait for the partition lock")

            t0 = time.monotonic()
            broker.terminate()
            answers = await asyncio.wait_for(asyncio.gather(*pops), 5)
            drained_in = time.monotonic() - t0
            assert [r.status_code for r in answers] == [204] * PARKED
            assert not in_flight.done()  # still waiting for its lock: the broker waits for it too
            await tx.commit()
            r = await asyncio.wait_for(in_flight, 5)
            assert r.status_code == 201 and r.json()[0]["status"] == "queued"
            assert broker.proc is not None
            code = await asyncio.to_thread(broker.proc.wait, 5)
            exited_in = time.monotonic() - t0
        assert code == 0
        assert exited_in < 5, exited_in
        print(f"drained {PARKED} parked pops in {drained_in * 1000:.0f} ms, exited in {exited_in * 1000:.0f} ms")
        m = re.search(r"event=shutdown drained_pops=(\d+) in_flight=(\d+)", broker.log())
        assert m, broker.log()[-2000:]
        assert int(m.group(1)) == PARKED and int(m.group(2)) >= PARKED + 1
        assert await conn.fetchval("SELECT count(*) FROM queen.log_consumers WHERE lease_id IS NOT NULL") == 0
    finally:
        broker.kill()
        await watcher.close()
