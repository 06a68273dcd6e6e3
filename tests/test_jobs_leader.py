"""The jobs' leadership (queen_pg/jobs/leadership.py): of all the processes on one database, one ticks
the jobs at their pace (the timers job every 0.5 s) and the others at the fallback (4x the interval;
the timers job every 5 s); when the leader's session ends (its process stops, its connection is
killed) a follower takes over at once and ticks; a leader that lost its session dials again and
follows. Real brokers on one real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.db.locks import JOBS_LEADER_LOCK
from queen_pg.jobs.leadership import Leadership
from queen_pg.jobs.supervisor import FOLLOWER_FACTOR
from queen_pg.jobs.timers import CONFIG, FOLLOWER_INTERVAL_S, TimersJob
from tests.conftest import Broker
from tests.helpers import eventually, until

LEADER_APP = "queen-pg leader:jobs"


def leadership(b: Broker) -> Leadership:
    job = b.app.state.jobs.jobs["timers"]
    assert isinstance(job, TimersJob) and job.leadership is not None
    return job.leadership


def timers(b: Broker) -> TimersJob:
    job = b.app.state.jobs.jobs["timers"]
    assert isinstance(job, TimersJob)
    return job


async def two_brokers(start_broker: Any) -> tuple[Broker, Broker]:
    """Two broker processes' worth of apps on one database with jobs on: (leader, follower)."""
    a: Broker = await start_broker(jobs_enabled=True)
    b: Broker = await start_broker(jobs_enabled=True)
    la, lb = leadership(a), leadership(b)
    await eventually(lambda: la.leader or lb.leader, "one of them to lead")
    leader, follower = (a, b) if la.leader else (b, a)
    # the follower is connected and waiting for the lock (not, say, failing to dial)
    await eventually(lambda: leadership(follower).backend_pid is not None, "the follower's session")
    return leader, follower


async def waiting_sessions(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = $1 AND wait_event_type = 'Lock'",
            LEADER_APP,
        )
    )


async def test_one_process_leads_and_the_other_ticks_at_the_fallback_pace(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    leader, follower = await two_brokers(start_broker)
    assert leadership(leader).leader and not leadership(follower).leader
    assert timers(leader).next_delay() == CONFIG.interval == 0.5
    assert timers(follower).next_delay() == FOLLOWER_INTERVAL_S == 5.0
    for name, job in follower.app.state.jobs.jobs.items():  # every leader-elected job follows
        if name != "timers":
            assert job.leadership is leadership(follower)
            assert job.next_delay() == FOLLOWER_FACTOR * job.config.interval, name
            assert leader.app.state.jobs.jobs[name].next_delay() == job.config.interval, name
    await until(lambda: waiting_sessions_is(conn, 1), "the follower's session to wait on the lock")
    # the leader holds the session lock (a transaction-level try-lock of the same key fails)
    assert await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", JOBS_LEADER_LOCK) is False


async def waiting_sessions_is(conn: asyncpg.Connection, n: int) -> bool:
    return await waiting_sessions(conn) == n


async def test_killing_the_leader_s_session_hands_the_lead_over_and_the_old_leader_follows(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    leader, follower = await two_brokers(start_broker)
    old, new = leadership(leader), leadership(follower)
    pid = old.backend_pid
    assert pid is not None
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid) is True
    await eventually(lambda: new.leader, "the follower to take the lead")
    assert new.terms == 1
    # the old leader noticed at once, dialled again and now waits for the lock as a follower
    await eventually(lambda: not old.leader, "the old leader to step down")
    await eventually(lambda: old.backend_pid not in (None, pid), "the old leader to dial again")
    await until(lambda: waiting_sessions_is(conn, 1), "the old leader to wait on the lock")
    assert not old.leader and old.terms == 1
    assert timers(leader).next_delay() == FOLLOWER_INTERVAL_S
    assert timers(follower).next_delay() == CONFIG.interval
    assert leader.app.state.jobs.jobs["lease_expiry"].next_delay() == 20.0  # 4 x 5 s


async def test_when_the_leader_stops_the_follower_takes_over_and_fires_a_due_timer(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    leader, follower = await two_brokers(start_broker)
    await leader.stop()  # its session ends with it
    await eventually(lambda: leadership(follower).leader, "the follower to take the lead")
    await until(lambda: waiting_sessions_is(conn, 0), "no session left waiting")
    payload = base64.b64encode(json.dumps({"n": 1}).encode()).decode()
    op = {"op": "schedule", "queue": "after", "timerKey": "k", "delayMs": -1, "payload": payload, "txn": "t-1"}
    async with httpx.AsyncClient(base_url=follower.url, timeout=30) as http:
        r = await http.post("/api/v1/timers", json={"operations": [op]})
        assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text

    async def fired() -> bool:
        return int(await conn.fetchval("SELECT count(*) FROM queen.timers")) == 0

    await until(fired, "the new leader to fire the due timer")
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'after'") == 1


async def test_a_follower_that_stops_leaves_no_session_waiting(start_broker: Any, conn: asyncpg.Connection) -> None:
    leader, follower = await two_brokers(start_broker)
    await until(lambda: waiting_sessions_is(conn, 1), "the follower to wait on the lock")
    await follower.stop()
    await until(lambda: waiting_sessions_is(conn, 0), "the follower's session to end")
    assert leadership(leader).leader


async def test_becoming_leader_ends_the_job_s_fallback_pause() -> None:
    lead = Leadership("postgresql://unused/x", JOBS_LEADER_LOCK, "jobs")
    job = TimersJob(leadership=lead)
    assert job.next_delay() == FOLLOWER_INTERVAL_S
    paused = asyncio.create_task(job.pause(3600, led=False))
    await asyncio.sleep(0)  # the pause is waiting
    assert not paused.done()
    lead._set(True)
    async with asyncio.timeout(10):  # an hour-long pause ends on the news, not on its clock
        await paused
    assert job.next_delay() == CONFIG.interval and not lead.news.is_set()
    async with asyncio.timeout(10):  # a pause told a stale role (the lead changed during the tick) is none
        await job.pause(3600, led=False)


async def test_an_unreachable_database_keeps_a_follower_that_retries(caplog: pytest.LogCaptureFixture) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = s.getsockname()[1]
    lead = Leadership(f"postgresql://x@127.0.0.1:{port}/x", JOBS_LEADER_LOCK, "jobs")
    caplog.set_level(logging.WARNING, "queen_pg.jobs")
    task = asyncio.create_task(lead.run())
    try:
        await eventually(lambda: "event=leadership_error" in caplog.text, "the failed dial to be logged")
        assert not lead.leader and lead.backend_pid is None and not task.done()
        assert TimersJob(leadership=lead).next_delay() == FOLLOWER_INTERVAL_S  # the job still ticks, slowly
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        s.close()
