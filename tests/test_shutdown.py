"""SIGTERM on a real `queen-pg serve` process: every parked long-poll pop is answered 204 at once
(they were parked for 600 s), a call in flight finishes, the process exits within 5 s, and one log
line says what was drained."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import asyncpg
import httpx

from queen_pg.server import SAME_STOP_S
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


async def test_sigterm_starts_a_lame_duck_that_a_proxy_can_see_and_a_second_sigterm_ends(
    db_url: str, tmp_path: Path
) -> None:
    """The first SIGTERM keeps the listener open for the drain delay (here 60 s, far beyond the test):
    /health answers 503 `draining`, a parked pop answers 204 at once, requests are still served but
    close their connection. A second SIGTERM ends the wait: the process exits 0 long before 60 s."""
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_DRAIN_DELAY_MS="60000")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            r = await http.post("/api/v1/push", json={"items": [{"queue": "lame", "payload": 0}]})
            assert r.status_code == 201 and r.headers.get("connection") != "close"
            assert (await http.get("/api/v1/pop/queue/lame", params={"autoAck": "true"})).status_code == 200
            pop = asyncio.create_task(http.get("/api/v1/pop/queue/lame", params={"wait": "true", "timeout": 600_000}))

            async def one_parked() -> bool:
                return await parked(http) == 1

            await until(one_parked, "the pop to park")
            broker.terminate()
            first_sigterm = time.monotonic()
            assert (await asyncio.wait_for(pop, 10)).status_code == 204

            async def draining() -> bool:
                return (await http.get("/health")).status_code == 503

            await until(draining, "/health to answer 503")
            r = await http.get("/health")
            assert r.json()["status"] == "draining" and r.json()["code"] == "draining"
            assert r.headers["connection"] == "close"
            # still serving, one request per connection
            r = await http.post("/api/v1/push", json={"items": [{"queue": "lame", "payload": 1}]})
            assert r.status_code == 201 and r.headers["connection"] == "close"
            # a new pop does not park: it answers at once (the message just pushed, or nothing)
            r = await asyncio.wait_for(
                http.get("/api/v1/pop/queue/lame", params={"wait": "true", "timeout": 600_000, "autoAck": "true"}), 10
            )
            assert r.status_code in (200, 204)
            assert broker.process.poll() is None  # the delay holds the listener open

            async def past_same_stop() -> bool:  # a SIGTERM sooner would be the same stop request
                assert (await http.get("/health")).status_code == 503
                return time.monotonic() - first_sigterm > SAME_STOP_S

            await until(past_same_stop, "the first SIGTERM to be SAME_STOP_S old")
        broker.terminate()  # the second SIGTERM
        code = await asyncio.to_thread(broker.process.wait, 20)
        assert code == 0
        assert "event=draining delay_ms=60000" in broker.log()
    finally:
        broker.kill()


async def test_sigterm_to_the_process_group_of_workers_keeps_the_lame_duck(db_url: str, tmp_path: Path) -> None:
    """`serve --workers 2` stopped as systemd stops a unit (KillMode=control-group: SIGTERM to every
    process of it, `kill -TERM -<pgid>` likewise): each worker gets that SIGTERM and, within the parent's
    0.5 s poll, the one the parent relays. Those are one stop request, not an operator's second SIGTERM:
    the lame duck must hold (the listener open, /health 503) for the drain delay. A SIGTERM sent later
    still ends it."""
    broker = ServeProcess(
        db_url, tmp_path / "broker.log", new_session=True, QUEEN_DRAIN_DELAY_MS="60000", QUEEN_WORKERS="2"
    )
    try:
        await broker.start()
        async with httpx.AsyncClient(base_url=broker.url, timeout=5) as http:

            async def both_up() -> bool:
                return broker.log().count("Application startup complete.") == 2

            await until(both_up, "both workers to finish start-up", within=60)
            signalled = time.monotonic()
            os.killpg(broker.pid, signal.SIGTERM)

            async def draining() -> bool:
                return (await http.get("/health")).status_code == 503

            await until(draining, "/health to answer 503")
            # past the parent's relay (it polls its signals every 0.5 s): still listening, still draining

            async def relay_passed_and_still_serving() -> bool:
                r = await http.get("/health")
                assert r.status_code == 503 and r.json()["status"] == "draining", r.text
                return time.monotonic() - signalled > 3

            await until(relay_passed_and_still_serving, "3 s of lame duck", within=20)
            assert broker.process.poll() is None
        os.killpg(broker.pid, signal.SIGTERM)  # an operator's second SIGTERM: no more waiting
        code = await asyncio.to_thread(broker.process.wait, 30)
        assert code == 0, broker.log()
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.proc.wait()


async def test_a_connection_accepted_before_the_shutdown_is_served_then_closed_not_dropped(
    db_url: str, tmp_path: Path, conn: asyncpg.Connection
) -> None:
    """A connection the broker accepted but had not read from when its shutdown began (a worker swapped
    by SIGHUP shares its socket with its successor, so a client's request often arrives just then) is
    served once and closed. uvicorn alone closes it, and the request already sent is lost unanswered."""
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_DRAIN_DELAY_MS="0")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            r = await http.post("/api/v1/push", json={"items": [{"queue": "held", "payload": 0}]})
            assert r.status_code == 201
            # a push in flight, waiting for its partition's lock, keeps the shutdown waiting
            pid = await conn.fetchval(
                "SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'held'"
            )
            tx = conn.transaction()
            await tx.start()
            await conn.execute("SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR UPDATE", pid)
            late = {"items": [{"queue": "held", "payload": 1}]}
            in_flight = asyncio.create_task(http.post("/api/v1/push", json=late))
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)  # nothing sent yet
            try:
                async with httpx.AsyncClient(base_url=broker.url, timeout=30) as later:  # queued after it:
                    assert (await later.get("/health")).status_code == 200  # so it was accepted first

                async def push_waits() -> bool:
                    return bool(
                        await conn.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE '%push%' AND datname = current_database()"
                        )
                    )

                await until(push_waits, "the push to wait for the partition lock")
                broker.terminate()

                async def shutting_down() -> bool:  # logged after uvicorn asked every connection to close
                    return "Waiting for connections to close" in broker.log()

                await until(shutting_down, "the shutdown to reach the open connections")
                body = b'{"items": [{"queue": "fresh", "payload": "last"}]}'
                writer.write(
                    b"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                answer = await asyncio.wait_for(reader.read(65536), 10)
                assert answer.startswith(b"HTTP/1.1 201"), answer
                assert b"connection: close" in answer.lower(), answer
                assert await asyncio.wait_for(reader.read(), 10) == b""  # then closed
            finally:
                writer.close()
            await tx.commit()
            assert (await asyncio.wait_for(in_flight, 10)).status_code == 201
        assert await asyncio.to_thread(broker.process.wait, 20) == 0
        stored = await conn.fetchval(
            "SELECT sum(p.next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = 'fresh'"
        )
        assert stored == 1
    finally:
        broker.kill()
