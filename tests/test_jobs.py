"""Background jobs against a real PostgreSQL: lease expiry, retention, DLQ payload fill, leadership per
tick, and the supervisor. Messages are pushed, popped and acked over real HTTP through a broker whose
own jobs are off; the tests run each job by hand and move time with ``now`` (p_now), never sleeping."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, cast

import asyncpg
import httpx
import pytest

from queen_pg.db import locks
from queen_pg.db.pool import Database
from queen_pg.engine.codec import txn_hash
from queen_pg.engine.waiters import Waiters
from queen_pg.jobs.dlq_fill import DlqFill
from queen_pg.jobs.lease_expiry import LeaseExpiry
from queen_pg.jobs.retention import Retention
from queen_pg.jobs.supervisor import Job, JobConfig, Supervisor
from tests.conftest import Broker
from tests.helpers import ack_batch, configure, pop, push, until

DAY = timedelta(days=1)


@pytest.fixture
async def broker(start_broker: Any) -> Broker:
    """The broker's own jobs are off: each test runs them by hand with its own clock."""
    b: Broker = await start_broker(jobs_enabled=False)
    return b


async def consume(http: httpx.AsyncClient, queue: str, batch: int = 100, group: str | None = None) -> list[Any]:
    """Pop up to ``batch`` messages and ack them completed; the messages."""
    params: dict[str, Any] = {"batch": batch} | ({"consumerGroup": group} if group else {})
    answer = await pop(http, queue, **params)
    assert answer is not None
    await ack_batch(http, answer["messages"], group=group)
    return list(answer["messages"])


async def segments(conn: asyncpg.Connection, queue: str) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(
            "SELECT s.base_offset, s.end_offset, s.created_at, s.dropped, s.codec FROM queen.log_segments s "
            "JOIN queen.log_partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id "
            "WHERE q.name = $1 ORDER BY s.base_offset",
            queue,
        )
    )


async def hashed_offsets(conn: asyncpg.Connection, queue: str) -> list[int]:
    rows = await conn.fetch(
        "SELECT t.msg_offset FROM queen.log_txns t JOIN queen.log_partitions p ON p.id = t.partition_id "
        "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY t.msg_offset",
        queue,
    )
    return [r["msg_offset"] for r in rows]


DLQ_ACK = "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7)"


async def dead_letter(conn: asyncpg.Connection, messages: list[dict[str, Any]]) -> None:
    """Dead-letter popped queue-mode messages with status 'dlq' through queen.ack_v1."""
    n = len(messages)
    rows = await conn.fetch(
        DLQ_ACK,
        [int(m["partitionId"]) for m in messages],
        [txn_hash(m["transactionId"]) for m in messages],
        [m["transactionId"] for m in messages],
        [uuid.UUID(m["leaseId"]) for m in messages],
        ["__QUEUE_MODE__"] * n,
        ["dlq"] * n,
        ["handler gave up"] * n,
    )
    assert all(r["success"] and r["dlq"] for r in rows), rows


async def dlq_payloads(conn: asyncpg.Connection) -> dict[str, Any]:
    """transactionId -> the stored payload (parsed), or the string 'NULL' while unfilled."""
    rows = await conn.fetch("SELECT transaction_id, payload FROM queen.log_dlq ORDER BY id")
    return {r["transaction_id"]: "NULL" if r["payload"] is None else json.loads(r["payload"]) for r in rows}


# --- retention ------------------------------------------------------------------------------------


async def test_retention_waits_for_every_group_and_evicts_segments_with_their_hashes(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    await configure(http, "r", retentionSeconds=60)
    await push(http, "r", [{"payload": "a0", "transactionId": "a0"}, {"payload": "a1", "transactionId": "a1"}])
    await push(http, "r", [{"payload": "b0", "transactionId": "b0"}, {"payload": "b1", "transactionId": "b1"}])
    await push(http, "r", [{"payload": "c0", "transactionId": "c0"}])
    await push(http, "keep", [{"payload": "k0", "transactionId": "k0"}])  # retention 0: kept forever
    await consume(http, "keep")
    assert len(await consume(http, "r", group="g1")) == 5
    assert len(await consume(http, "r", batch=2, group="g2")) == 2  # g2 is past A only
    _, seg_b, seg_c = await segments(conn, "r")
    far = seg_c["created_at"] + DAY
    job = Retention()

    # every segment is old enough, but g2 still needs B and C
    assert await job.run_once(db, far) == 1
    assert [s["base_offset"] for s in await segments(conn, "r")] == [2, 4]
    assert await hashed_offsets(conn, "r") == [2, 3, 4]
    assert await job.run_once(db, far) == 0

    # g2 catches up: B is past the window, C (created at that very instant) is not
    assert len(await consume(http, "r", group="g2")) == 3
    assert seg_b["created_at"] < seg_c["created_at"]
    assert await job.run_once(db, seg_c["created_at"] + timedelta(seconds=60)) == 1
    assert [s["base_offset"] for s in await segments(conn, "r")] == [4]
    assert await hashed_offsets(conn, "r") == [4]

    assert await job.tick(db, far + 3650 * DAY) == 1
    assert await segments(conn, "r") == [] and await hashed_offsets(conn, "r") == []
    assert len(await segments(conn, "keep")) == 1 and await hashed_offsets(conn, "keep") == [0]
    # the cursors are untouched and nothing more comes back
    assert await pop(http, "r", consumerGroup="g1") is None


async def test_completed_retention_needs_a_consumer_past_the_segment(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    await configure(http, "c", completedRetentionSeconds=30)
    await push(http, "c", [{"payload": 1, "transactionId": "x"}])
    (seg,) = await segments(conn, "c")
    later = seg["created_at"] + timedelta(seconds=31)
    job = Retention()
    assert await job.run_once(db, later) == 0  # no consumer group yet: nothing was completed
    answer = await pop(http, "c")
    assert await job.run_once(db, later) == 0  # leased, not completed
    await ack_batch(http, answer["messages"])
    assert await job.run_once(db, seg["created_at"] + timedelta(seconds=30)) == 0  # not yet past the window
    assert await job.run_once(db, later) == 1
    assert await segments(conn, "c") == [] and await hashed_offsets(conn, "c") == []


async def test_retention_keeps_a_segment_until_its_dead_letters_are_filled(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    await configure(http, "d", retentionSeconds=60)
    await push(http, "d", [{"payload": {"n": 0}, "transactionId": "d0"}, {"payload": {"n": 1}, "transactionId": "d1"}])
    ms = (await pop(http, "d", batch=10))["messages"]
    await ack_batch(http, ms[:1])
    await dead_letter(conn, ms[1:])
    (seg,) = await segments(conn, "d")
    far = seg["created_at"] + DAY
    job = Retention()
    assert await job.run_once(db, far) == 0  # the cursor is past, but d1's payload is only in the segment
    assert await DlqFill().tick(db) == 1
    assert await dlq_payloads(conn) == {"d1": {"n": 1}}
    assert await job.run_once(db, far) == 1
    assert await segments(conn, "d") == [] and await hashed_offsets(conn, "d") == []
    assert await dlq_payloads(conn) == {"d1": {"n": 1}}  # the dead letter outlives its segment


async def test_retention_decides_again_after_a_seek_it_waited_for(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database, db_url: str
) -> None:
    now = await _evictable_segment(http, conn)
    seeker = await asyncpg.connect(db_url)
    try:
        tx = seeker.transaction()
        await tx.start()
        # what a seek does: lock the cursor row, move it back to the first retained segment
        await seeker.execute("SELECT 1 FROM queen.log_consumers FOR UPDATE")
        call = asyncio.create_task(Retention().run_once(db, now))
        await waiting_on_a_lock(conn)
        await seeker.execute("UPDATE queen.log_consumers SET cursor_offset = 0")
        await tx.commit()
    finally:
        await seeker.close()
    assert await call == 0  # the segment is needed again: a cursor never points into a deleted range
    assert len(await segments(conn, "q")) == 1


async def waiting_on_a_lock(conn: asyncpg.Connection) -> None:
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    await until(lambda: conn.fetchval(query), "a session to wait on a lock")


# --- lease expiry ---------------------------------------------------------------------------------


async def test_lease_expiry_clears_expired_leases_keeps_live_ones_and_wakes_waiters(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    await configure(http, "l1", leaseTime=60)
    await configure(http, "l2", leaseTime=600)
    await push(http, "l1", [{"payload": 0, "transactionId": "a"}])
    await push(http, "l1", [{"payload": 1, "transactionId": "b"}])
    await push(http, "l2", [{"payload": 2, "transactionId": "c"}])
    (done,) = await consume(http, "l1", batch=1)  # a lease released by its acks: released_lease_id
    (held,) = (await pop(http, "l1"))["messages"]
    await pop(http, "l2")
    before = {r["q"]: r for r in await conn.fetch(LEASES)}
    expires = before["l1"]["lease_expires_at"]
    assert before["l1"]["released_lease_id"] == uuid.UUID(done["leaseId"])

    waiters = Waiters(10)
    l1_event, l2_event = waiters.subscribe("default", "l1"), waiters.subscribe("default", "l2")
    job = LeaseExpiry(waiters.notify)
    assert await job.run_once(db, expires - timedelta(milliseconds=1)) == 0  # still live
    assert await job.run_once(db, expires) == 1  # expired at its expiry instant, as pops see it
    assert l1_event.is_set() and not l2_event.is_set()
    after = {r["q"]: r for r in await conn.fetch(LEASES)}
    assert (after["l1"]["lease_id"], after["l1"]["lease_expires_at"], after["l1"]["lease_end"]) == (None, None, None)
    assert after["l1"]["released_lease_id"] == uuid.UUID(done["leaseId"])  # not the expired lease
    assert after["l1"]["cursor_offset"] == 1
    assert after["l2"] == before["l2"]  # live: untouched
    assert await job.run_once(db, expires) == 0

    # the expired holder is refused; the message comes back as a redelivery
    r = await http.post("/api/v1/ack", json={k: held[k] for k in ("transactionId", "partitionId", "leaseId")})
    assert r.json()[0]["success"] is False
    (again,) = (await pop(http, "l1"))["messages"]
    assert again["transactionId"] == "b" and again["deliveryAttempt"] == 2


LEASES = """
SELECT q.name AS q, c.lease_id, c.lease_expires_at, c.lease_end, c.released_lease_id, c.cursor_offset
  FROM queen.log_consumers c JOIN queen.queues q ON q.id = c.queue_id
"""


async def test_leases_by_id_rows_live_as_long_as_their_lease(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    """queen.log_leases (revision 0010): a leased pop writes one row per claimed cursor row; lease
    extend and the expiry find the lease through it; the expiry job deletes the rows whose cursor let
    the lease go (acked, expired) and keeps a live lease's row, which extend still finds."""
    await configure(http, "lb", leaseTime=60)
    for p in ("a", "b", "c"):
        await push(http, "lb", [{"payload": p, "transactionId": f"t{p}"}], partition=p)
    rows = "SELECT lease_id, partition_id FROM queen.log_leases ORDER BY 1, 2"
    done = await pop(http, "lb", batch=1)  # acked below: its row goes stale
    two = await pop(http, "lb", batch=2, partitions=2)  # one lease, two cursor rows
    assert two["partitionsClaimed"] == 2
    lease = uuid.UUID(two["leaseId"])
    assert sorted(r["lease_id"] for r in await conn.fetch(rows)) == sorted([uuid.UUID(done["leaseId"]), lease, lease])
    await ack_batch(http, done["messages"])
    r = await http.post(f"/api/v1/lease/{lease}/extend")
    assert r.status_code == 200 and r.json()["renewed"] == 2
    job = LeaseExpiry(lambda tenant, queue: None)
    assert await job.run_once(db) == 0
    assert [r["lease_id"] for r in await conn.fetch(rows)] == [lease, lease]  # the acked one's went
    # the lease runs out: the job clears both cursor rows, then their rows
    expires = await conn.fetchval("SELECT max(lease_expires_at) FROM queen.log_consumers WHERE lease_id = $1", lease)
    assert await job.run_once(db, expires) == 2
    assert await conn.fetch(rows) == []
    r = await http.post(f"/api/v1/lease/{lease}/extend")
    assert r.status_code == 200 and r.json()["renewed"] == 0


# --- dlq fill -------------------------------------------------------------------------------------


async def test_dlq_fill_writes_pushed_payloads_also_from_segments_with_dropped_frames(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    pushed = {"p0": {"a": 1, "nested": {"x": [1, 2]}}, "p1": [1, 2.5, "x", None], "p3": "last", "first": True}
    await push(http, "q", [{"payload": pushed["first"], "transactionId": "first"}])
    res = await push(
        http,
        "q",
        [
            {"payload": "dup of a stored message", "transactionId": "first"},
            {"payload": pushed["p0"], "transactionId": "p0"},
            {"payload": pushed["p1"], "transactionId": "p1"},
            {"payload": "dup inside the call", "transactionId": "p0"},
            {"payload": pushed["p3"], "transactionId": "p3"},
        ],
    )
    assert [r["status"] for r in res] == ["duplicate", "queued", "queued", "duplicate", "queued"]
    assert [(s["base_offset"], s["dropped"]) for s in await segments(conn, "q")] == [(0, None), (1, [0, 3])]
    ms = (await pop(http, "q", batch=10))["messages"]
    assert [m["transactionId"] for m in ms] == ["first", "p0", "p1", "p3"]
    await dead_letter(conn, [ms[2], ms[0], ms[3], ms[1]])
    assert set((await dlq_payloads(conn)).values()) == {"NULL"}

    job = DlqFill(JobConfig("dlq_fill", interval=5.0, limit=3))  # two batches; one segment spans both
    assert await job.tick(db) == 4
    assert await dlq_payloads(conn) == pushed
    assert await job.tick(db) == 0


async def test_dlq_fill_reads_raw_segments_too(http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database) -> None:
    await push(http, "q", [{"payload": {"again": [1]}, "transactionId": "r"}])
    (m,) = (await pop(http, "q"))["messages"]
    await dead_letter(conn, [m])
    assert await DlqFill().tick(db) == 1
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/r/retry")
    assert r.status_code == 200 and r.json()["status"] == "requeued", r.text
    assert [s["codec"] for s in await segments(conn, "q")] == [1, 0]  # put back as a raw frame written by SQL
    (again,) = (await pop(http, "q"))["messages"]
    await dead_letter(conn, [again])
    assert await DlqFill().tick(db) == 1
    assert await dlq_payloads(conn) == {"r": {"again": [1]}}


async def test_dlq_fill_never_blocks_on_a_payload_jsonb_refuses_or_a_missing_segment(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen_pg.jobs")
    await push(http, "nul", [{"payload": {"s": "a\u0000b"}, "transactionId": "nul"}])
    await push(http, "gone", [{"payload": 1, "transactionId": "gone"}])
    await push(http, "ok", [{"payload": {"fine": True}, "transactionId": "ok"}])
    for queue in ("nul", "gone", "ok"):
        await dead_letter(conn, (await pop(http, queue))["messages"])
    await conn.execute(
        "DELETE FROM queen.log_segments WHERE partition_id IN "
        "(SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'gone')"
    )
    assert await DlqFill().tick(db) == 3
    stored = await dlq_payloads(conn)
    assert stored == {"nul": '{"s":"a\\u0000b"}', "gone": None, "ok": {"fine": True}}
    assert "event=dlq_payload_missing" in caplog.text and "segment=gone" in caplog.text
    assert "event=job_done job=dlq_fill payloads=2 missing=1" in caplog.text


# --- leadership per tick --------------------------------------------------------------------------

Setup = Callable[[httpx.AsyncClient, asyncpg.Connection], Awaitable[datetime]]


async def _expired_lease(http: httpx.AsyncClient, conn: asyncpg.Connection) -> datetime:
    await push(http, "q", [{"payload": 1, "transactionId": "t"}])
    await pop(http, "q")
    expires: datetime = await conn.fetchval("SELECT lease_expires_at FROM queen.log_consumers")
    return expires + DAY


async def _evictable_segment(http: httpx.AsyncClient, conn: asyncpg.Connection) -> datetime:
    await configure(http, "q", retentionSeconds=60)
    await push(http, "q", [{"payload": 1, "transactionId": "t"}])
    await consume(http, "q")
    return (await segments(conn, "q"))[0]["created_at"] + DAY  # type: ignore[no-any-return]


async def _dead_letter(http: httpx.AsyncClient, conn: asyncpg.Connection) -> datetime:
    await push(http, "q", [{"payload": {"v": 1}, "transactionId": "t"}])
    await dead_letter(conn, (await pop(http, "q"))["messages"])
    now: datetime = await conn.fetchval("SELECT now()")
    return now


JOBS: dict[str, tuple[Callable[[], Job], int, Setup]] = {
    "lease_expiry": (lambda: LeaseExpiry(lambda tenant, queue: None), locks.LEASE_EXPIRY_LOCK, _expired_lease),
    "retention": (Retention, locks.RETENTION_LOCK, _evictable_segment),
    "dlq_fill": (DlqFill, locks.DLQ_FILL_LOCK, _dead_letter),
}


@pytest.mark.parametrize("name", list(JOBS))
async def test_a_replica_holding_the_jobs_key_makes_run_once_do_nothing(
    name: str, http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database, db_url: str
) -> None:
    make, key, setup = JOBS[name]
    now = await setup(http, conn)
    job = make()
    before = await counts(conn)
    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT pg_advisory_xact_lock($1)", key)
        assert await job.run_once(db, now) == 0
        assert await counts(conn) == before
        await tx.commit()
    finally:
        await other.close()
    assert await job.tick(db, now) == 1
    assert await counts(conn) != before


async def counts(conn: asyncpg.Connection) -> tuple[Any, ...]:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM queen.log_consumers WHERE lease_id IS NOT NULL),"
        " (SELECT count(*) FROM queen.log_segments), (SELECT count(*) FROM queen.log_txns),"
        " (SELECT count(*) FROM queen.log_dlq WHERE payload IS NULL)"
    )
    return tuple(row)


@pytest.mark.parametrize("name", ["lease_expiry", "retention"])
async def test_two_racing_run_once_calls_do_the_work_once(
    name: str, http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    make, _, setup = JOBS[name]
    now = await setup(http, conn)
    for i in range(5):  # four more partitions with the same state, an older lease/segment each
        await push(http, "q", [{"payload": i, "transactionId": f"t{i}"}], partition=f"p{i}")
        if name == "retention":
            await consume(http, "q", batch=1)
        else:
            await pop(http, "q")
    done = await asyncio.gather(make().run_once(db, now), make().run_once(db, now))
    assert sum(done) == 6
    assert await make().run_once(db, now) == 0


async def test_two_racing_dlq_fills_store_every_payload(
    http: httpx.AsyncClient, conn: asyncpg.Connection, db: Database
) -> None:
    await push(http, "q", [{"payload": {"i": i}, "transactionId": f"t{i}"} for i in range(6)])
    await dead_letter(conn, (await pop(http, "q", batch=10))["messages"])
    a, b = DlqFill(JobConfig("dlq_fill", 5.0, 2)), DlqFill(JobConfig("dlq_fill", 5.0, 2))
    await asyncio.gather(a.tick(db), b.tick(db))
    await a.tick(db)  # a batch handed out to a call that lost the next tick is handed out again
    assert await dlq_payloads(conn) == {f"t{i}": {"i": i} for i in range(6)}


# --- the loop and the supervisor ------------------------------------------------------------------

NO_DB = cast(Database, None)


class Scripted(Job):
    """run_once answers from a script: an int is returned, an exception raised; then 0 forever."""

    def __init__(self, script: list[int | Exception], interval: float = 0.01, limit: int = 10) -> None:
        super().__init__(JobConfig("scripted", interval, limit))
        self.script = script
        self.calls = 0
        self.reached: dict[int, asyncio.Event] = {}

    def at_call(self, n: int) -> asyncio.Event:
        return self.reached.setdefault(n, asyncio.Event())

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        self.calls += 1
        for n, ev in self.reached.items():
            if self.calls >= n:
                ev.set()
        step = self.script.pop(0) if self.script else 0
        if isinstance(step, Exception):
            raise step
        return step


async def test_tick_repeats_run_once_while_batches_come_back_full() -> None:
    job = Scripted([10, 10, 3, 10])
    assert await job.tick(NO_DB) == 23 and job.calls == 3


async def test_a_job_that_raises_is_logged_and_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="queen_pg.jobs")
    job = Scripted([RuntimeError("db went away"), RuntimeError("still away"), 1])
    sup = Supervisor()
    sup.start_job(job, NO_DB)
    await asyncio.wait_for(job.at_call(5).wait(), 10)
    task = sup.task("scripted")
    assert task is not None
    await sup.stop()
    assert task.cancelled()
    assert "event=job_error job=scripted failures=1" in caplog.text and "db went away" in caplog.text
    assert "event=job_error job=scripted failures=2" in caplog.text
    assert "event=job_recovered job=scripted after_failures=2" in caplog.text
    assert sup.restarts("scripted") == 0  # survived inside the loop; the task never crashed


async def test_supervisor_restarts_a_crashed_task(caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor(restart_delay=0.01)
    runs = 0
    second = asyncio.Event()

    async def worker() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("crash")
        second.set()
        await asyncio.Event().wait()

    sup.start("worker", worker)
    await asyncio.wait_for(second.wait(), 10)
    assert sup.restarts("worker") == 1
    assert "event=task_crashed task=worker critical=False restarts=1" in caplog.text
    await sup.stop()


async def test_a_crashed_critical_task_stops_the_process_instead() -> None:
    fatal: list[str] = []
    sup = Supervisor(on_fatal=fatal.append, restart_delay=0.01)

    async def core() -> None:
        raise RuntimeError("dead")

    sup.start("core", core, critical=True)
    task = sup.task("core")
    assert task is not None
    await asyncio.wait_for(task, 10)
    assert fatal == ["core"] and sup.restarts("core") == 0
    await sup.stop()


async def test_shutdown_cancels_and_awaits_every_task() -> None:
    sup = Supervisor()
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def sleeper() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    sup.start("sleeper", sleeper)
    with pytest.raises(ValueError, match="already supervised"):
        sup.start("sleeper", sleeper)
    await asyncio.wait_for(started.wait(), 10)
    task = sup.task("sleeper")
    await sup.stop()
    assert task is not None and task.cancelled() and cleaned.is_set()
    with pytest.raises(RuntimeError, match="stopping"):
        sup.start("late", sleeper)


async def test_the_broker_runs_its_jobs_under_the_supervisor_unless_disabled(start_broker: Any) -> None:
    on: Broker = await start_broker(jobs_enabled=True)
    off: Broker = await start_broker(jobs_enabled=False)
    sup: Supervisor = on.app.state.jobs
    assert {"dlq_fill", "lease_expiry", "retention"} <= set(sup.names)
    tasks = [sup.task(n) for n in sup.names]
    assert all(t is not None and not t.done() for t in tasks)
    # not jobs: every process runs them (its maintenance switches, its own heap)
    assert off.app.state.jobs.names == ["maintenance_refresh", "malloc_trim"]
    await on.stop()
    assert all(t is not None and t.cancelled() for t in tasks)
