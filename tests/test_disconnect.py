"""A long-poll pop whose client went away takes no lease (real HTTP, raw sockets, a real broker): a
client that disconnects while parked leaves the next message to the next consumer, at once; a claim
that was running when its client left is given back at once (queen.lease_release_v1), as the same
delivery attempt; `queen-pg tail` stopped by Ctrl-C does not re-create the group it deleted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import asyncpg
import httpx

from tests.conftest import Broker
from tests.helpers import eventually, push, until


async def open_pop(port: int, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


async def test_a_client_gone_while_parked_leaves_the_next_message_to_the_next_consumer(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    waiters = broker.app.state.queen.waiters
    _, writer = await open_pop(broker.port, "/api/v1/pop/queue/dq?wait=true&timeout=60000&consumerGroup=g")
    await eventually(lambda: waiters.parked == 1, "the pop to park")
    await hang_up(writer)  # like curl giving up after 2 s
    await push(http, "dq", [{"payload": "next", "transactionId": "next"}])
    r = await http.get("/api/v1/pop/queue/dq", params={"consumerGroup": "g"})
    assert r.status_code == 200, "the message was leased to the client that had gone"
    (m,) = r.json()["messages"]
    assert m["transactionId"] == "next" and m["deliveryAttempt"] == 1
    await until(lambda: _done(broker), "the abandoned pop to end")
    assert waiters.parked == 0
    leases = await conn.fetchval("SELECT count(*) FROM queen.log_consumers WHERE lease_id IS NOT NULL")
    assert leases == 1  # the consumer's above, no other


async def _done(broker: Broker) -> bool:
    return not broker.server.server_state.tasks


async def test_a_claim_running_when_the_client_left_gives_the_lease_back_at_once(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "rq", [{"payload": {"n": 1}, "transactionId": "m1"}])
    # hold the queue row: the pop of a new group waits for it inside pop_v1 (queen._create_group)
    tx = conn.transaction()
    await tx.start()
    await conn.execute("SELECT id FROM queen.queues WHERE name = 'rq' FOR UPDATE")
    before = set(broker.server.server_state.connections)  # the http fixture's idle keep-alive one
    _, writer = await open_pop(broker.port, "/api/v1/pop/queue/rq?wait=true&timeout=30000&consumerGroup=late")

    async def claim_waits() -> bool:
        async with broker.app.state.queen.db.pool.acquire() as c:
            return bool(
                await c.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE '%pop_v1%'"
                )
            )

    await until(claim_waits, "the pop's claim to wait for the queue row")
    await hang_up(writer)
    await eventually(lambda: broker.server.server_state.connections <= before, "the broker to see the hang-up")
    await tx.commit()  # the claim goes on and leases m1 for a client that is gone
    await until(lambda: _done(broker), "the abandoned pop to end")

    held = await conn.fetchval(
        "SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'late' AND lease_id IS NOT NULL"
    )
    assert held == 0, "a lease is held by nobody"
    r = await http.get("/api/v1/pop/queue/rq", params={"consumerGroup": "late"})
    assert r.status_code == 200, "the message is leased to the client that had gone"
    (m,) = r.json()["messages"]
    assert m["transactionId"] == "m1"
    assert m["deliveryAttempt"] == 1  # the undelivered claim did not count as a delivery


async def test_release_only_touches_a_lease_still_held(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """lease_release_v1 with a lease id that is not (or no longer) the holder's changes nothing."""
    await push(http, "rel", [{"payload": 1, "transactionId": "a"}])
    r = await http.get("/api/v1/pop/queue/rel", params={"consumerGroup": "g"})
    lease = r.json()["leaseId"]
    row = await conn.fetchrow(
        "SELECT partition_id, lease_id, delivered_end, attempts FROM queen.log_consumers WHERE consumer_group = 'g'"
    )
    released = await conn.fetchval(
        "SELECT queen.lease_release_v1('default', 'g', gen_random_uuid(), $1, '{0}', '{1}', '{0}', '{1}')",
        [row["partition_id"]],
    )
    assert released == 0
    after = await conn.fetchrow(
        "SELECT partition_id, lease_id, delivered_end, attempts FROM queen.log_consumers WHERE consumer_group = 'g'"
    )
    assert after == row and str(after["lease_id"]) == lease


async def test_tail_stopped_by_ctrl_c_does_not_recreate_its_group(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    waiters = broker.app.state.queen.waiters
    await push(http, "tailq", [{"payload": 0}])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "queen_pg.cli",
        "tail",
        "tailq",
        "--url",
        broker.url,
        "--wait-ms",
        "60000",
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await eventually(lambda: waiters.parked == 1, "the tail's long-poll to park", within=30)
        groups = "SELECT count(*) FROM queen.log_groups WHERE name LIKE 'queen-pg-tail-%'"
        assert await conn.fetchval(groups) == 1
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err
        # the parked pop has ended (it would otherwise re-poll every second and re-create the group)
        await eventually(lambda: waiters.parked == 0, "the tail's pop to end")
        await until(lambda: _done(broker), "the tail's pop to end")
        await push(http, "tailq", [{"payload": 1}])  # a push would wake a pop still parked
        assert await conn.fetchval(groups) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
