"""Pop fusion (queen_pg/engine/fusion.py, queen.pop_many_v1): pops of different consumer groups on one
queue share one procedure call, and each group gets exactly what it would have got alone; a member that
makes the fused call fail fails alone; two pops of one group never share a call. Engine tests drive a
Fuser against a real PostgreSQL with a batch that leaves when full (no timer); the HTTP test goes
through a real broker whose long polls a push wakes together."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.db.pool import Database, Record
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine.fusion import FuseConfig, Fuser, Lane
from queen_pg.errors import QueenError
from tests.conftest import Broker
from tests.helpers import eventually, until
from tests.test_pop_engine import request as engine_request

FULL_ONLY = dict(hold_us=60_000_000, inflight=0)  # a batch leaves only when full
GROUPS = [f"g{n}" for n in range(6)]


def request(queue: str, group: str, batch: int = 4, auto_ack: bool = False) -> pop_engine.PopRequest:
    return replace(engine_request(0), queue=queue, group=group, batch=batch, wait=False, auto_ack=auto_ack)


async def fill(db: Database, queue: str) -> None:
    """Three partitions of 5 messages, pushed in the same order on every queue (the same offsets)."""
    for part in ("p0", "p1", "p2"):
        items = [push_engine.NewMessage(queue, part, f'"{part}-{i}"'.encode(), f"{part}-{i}", None) for i in range(5)]
        await push_engine.push(db, "default", items)


def shape(rows: list[Record]) -> list[tuple[Any, ...]]:
    """What a claim gave, without its lease id and clock: partition, range, attempts, segments."""
    return [
        (r["partition_name"], r["lease_start"], r["lease_end"], r["redelivered_end"], r["attempts"], r["base_offset"])
        for r in rows
    ]


async def cursors(conn: asyncpg.Connection, queue: str) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT p.name, lc.consumer_group, lc.cursor_offset, lc.lease_end, lc.attempts, lc.delivered_end,"
        " lc.lease_id IS NOT NULL AS leased, lc.acked_total"
        " FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id"
        " JOIN queen.queues q ON q.id = lc.queue_id WHERE q.name = $1 ORDER BY 1, 2",
        queue,
    )
    return [tuple(r) for r in rows]


async def test_groups_pops_share_one_call_and_each_gets_what_it_would_alone(
    db: Database, conn: asyncpg.Connection
) -> None:
    await fill(db, "fused")
    await fill(db, "alone")
    fuser = Fuser(db, FuseConfig(max_items=len(GROUPS), **FULL_ONLY))
    for round_ in range(3):  # new groups (created by the fused call), then existing ones (pop_v1's fast path)
        auto = round_ == 2
        calls = [pop_engine.PopCall(request("fused", g, auto_ack=auto), uuid.uuid4()) for g in GROUPS]
        fused = await asyncio.gather(*(fuser.pop("default", c, False) for c in calls))
        alone = [
            await pop_engine.fetch_alone(
                db, "default", pop_engine.PopCall(request("alone", g, 4, auto), uuid.uuid4()), False
            )
            for g in GROUPS
        ]
        assert [shape(rows) for rows in fused] == [shape(rows) for rows in alone]
        assert all(rows for rows in fused)  # every group got messages
        for call, rows in zip(calls, fused, strict=True):  # each its own lease (none under autoAck)
            want = None if auto else call.lease_id
            assert {r["lease_expires_at"] is None for r in rows} == {auto}
            if want is not None:
                leased = await conn.fetchval("SELECT count(*) FROM queen.log_leases WHERE lease_id = $1", want)
                assert leased == 1
    lane = fuser.pop_lane("default", "fused", False)
    assert (lane.stats.calls, lane.stats.requests, lane.stats.isolated) == (3, 3 * len(GROUPS), 0)
    assert await cursors(conn, "fused") == await cursors(conn, "alone")


async def test_a_failing_member_fails_alone(db: Database, conn: asyncpg.Connection) -> None:
    # A group name with a NUL byte passes the engine but PostgreSQL text refuses it: the fused call fails
    # as a whole (nothing written), then every member is retried alone and only the culprit gets the error.
    await fill(db, "q")
    fuser = Fuser(db, FuseConfig(max_items=3, **FULL_ONLY))
    good_a, bad, good_b = await asyncio.gather(
        fuser.pop("default", pop_engine.PopCall(request("q", "a"), uuid.uuid4()), False),
        fuser.pop("default", pop_engine.PopCall(request("q", "b\x00ad"), uuid.uuid4()), False),
        fuser.pop("default", pop_engine.PopCall(request("q", "b"), uuid.uuid4()), False),
        return_exceptions=True,
    )
    assert isinstance(bad, QueenError) and bad.status == 500, bad
    assert not isinstance(good_a, BaseException) and not isinstance(good_b, BaseException)
    assert shape(good_a) == shape(good_b) == [("p0", 0, 4, 0, 1, 0)]
    lane = fuser.pop_lane("default", "q", False)
    assert (lane.stats.isolated, lane.stats.calls) == (1, 4)  # the fused call, then three alone
    groups = await conn.fetch("SELECT name FROM queen.log_groups ORDER BY name")
    assert [g["name"] for g in groups] == ["a", "b"]


async def test_pops_of_one_group_never_share_a_call(db: Database) -> None:
    await fill(db, "q")
    fuser = Fuser(db, FuseConfig(max_items=2, **FULL_ONLY))
    mine = [pop_engine.PopCall(request("q", "same"), uuid.uuid4()) for _ in range(2)]
    other = pop_engine.PopCall(request("q", "other"), uuid.uuid4())
    first = asyncio.create_task(fuser.pop("default", mine[0], False))  # waits in the lane for a second member
    lane = fuser.pop_lane("default", "q", False)
    await eventually(lambda: lane.queued == 1, "the first pop to wait in the lane")
    second = await fuser.pop("default", mine[1], False)  # its group is in the lane: it goes alone, at once
    assert lane.queued == 1 and not first.done()
    got_other = await fuser.pop("default", other, False)  # fills the batch with the first
    got_first = await first
    assert (lane.stats.calls, lane.stats.requests) == (1, 2)
    assert {r["partition_name"] for r in got_first}.isdisjoint({r["partition_name"] for r in second})
    assert shape(got_other) == [("p0", 0, 4, 0, 1, 0)]


async def test_a_push_wakes_the_groups_long_polls_into_one_call(start_broker: Any, conn: asyncpg.Connection) -> None:
    groups = [f"fan{n}" for n in range(5)]
    # PostgreSQL counts the procedure calls too, from the broker's connections on (opened after this)
    await conn.execute(f"ALTER DATABASE {await conn.fetchval('SELECT current_database()')} SET track_functions = 'pl'")
    broker: Broker = await start_broker(
        fuse_inflight=0, fuse_hold_us=300_000, fuse_max_items=len(groups), jobs_enabled=False
    )
    fuser = broker.app.state.queen.fuser
    waiters = broker.app.state.queen.waiters
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        for g in groups:  # no queue yet: each finds nothing
            r = await http.get("/api/v1/pop/queue/fan", params={"consumerGroup": g})
            assert r.status_code == 204
        params: list[dict[str, Any]] = [
            {"consumerGroup": g, "wait": "true", "timeout": 20_000, "batch": 10} for g in groups
        ]
        parked = [asyncio.create_task(http.get("/api/v1/pop/queue/fan", params=p)) for p in params]
        await eventually(lambda: waiters.parked == len(groups), "every group's long poll to park")
        lane = fuser.pop_lane("default", "fan", False)
        calls0, requests0 = lane.stats.calls, lane.stats.requests  # the claims before parking
        items = [{"queue": "fan", "partition": "p", "transactionId": f"t{i}", "payload": i} for i in range(3)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
        answers = [await t for t in parked]
    for a in answers:
        assert a.status_code == 200, a.text
        body = a.json()
        assert [m["transactionId"] for m in body["messages"]] == ["t0", "t1", "t2"]
    # the five woken pops made ONE procedure call
    assert (lane.stats.calls - calls0, lane.stats.requests - requests0, lane.stats.isolated) == (1, 5, 0)
    # PostgreSQL's count of the whole test: the five pops before the queue existed (one pop_v1 call each),
    # the five claims before parking (one pop_many_v1 call, which finds no queue and calls no pop_v1) and
    # the five woken ones (one pop_many_v1 call, running pop_v1 for each)
    want = {"pop_v1": 5 + 5, "pop_many_v1": 2}
    await until(lambda: function_calls(conn, broker, want), "PostgreSQL to count the calls", within=20)
    leases = await conn.fetch("SELECT consumer_group, lease_end FROM queen.log_consumers ORDER BY 1")
    assert [(r["consumer_group"], r["lease_end"]) for r in leases] == [(g, 3) for g in groups]


async def function_calls(conn: asyncpg.Connection, broker: Broker, want: dict[str, int]) -> bool:
    """Whether pg_stat_user_functions counts ``want`` calls of pop_v1 and pop_many_v1 (never more); each
    broker connection is asked to report its counters first."""
    db = broker.app.state.queen.db
    await db.fetch("SELECT pg_stat_force_next_flush()")  # the broker's hot connection
    for _ in range(db.pool.get_size()):
        async with db.pool.acquire() as c:
            await c.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(
        "SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = 'queen'"
        " AND funcname IN ('pop_v1', 'pop_many_v1')"
    )
    got = {"pop_v1": 0, "pop_many_v1": 0} | {r["funcname"]: r["calls"] for r in rows}
    assert all(got[f] <= n for f, n in want.items()), got
    return got == want


async def test_pop_fusion_off(start_broker: Any) -> None:
    broker: Broker = await start_broker(fuse_pops=False, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]})
        assert r.status_code == 201
        got = await asyncio.gather(*(http.get("/api/v1/pop/queue/q", params={"consumerGroup": g}) for g in GROUPS))
    assert [r.status_code for r in got] == [200] * len(GROUPS)
    assert [lane for lane in broker.app.state.queen.fuser.lanes() if lane.name == "pop"] == []  # pop_v1 each


async def test_no_such_queue_answers_every_member_nothing(db: Database, conn: asyncpg.Connection) -> None:
    rows = await conn.fetch(
        "SELECT * FROM queen.pop_many_v1('default', 'nothere', '{NULL,NULL}', '{a,b}', '{1,1}', '{1,1}',"
        " ARRAY[gen_random_uuid(), gen_random_uuid()], '{f,f}', '{NULL,NULL}', '{NULL,NULL}', '{NULL,NULL}')"
    )
    assert rows == []
    assert await conn.fetchval("SELECT count(*) FROM queen.log_groups") == 0


async def test_pop_many_answers_pop_v1s_columns(conn: asyncpg.Connection) -> None:
    """pop_many_v1's rows are ``member`` and then pop_v1's columns, by name and type, in order (the two
    declarations are written apart: this holds them alike)."""
    sql = (
        "SELECT array_agg(n ORDER BY i) AS names, array_agg(t::regtype::text ORDER BY i) AS types"
        " FROM pg_proc, unnest(proargnames, proallargtypes, proargmodes) WITH ORDINALITY AS a(n, t, m, i)"
        " WHERE oid = $1::regprocedure AND m = 't'"
    )
    one = await conn.fetchrow(
        sql,
        "queen.pop_v1(text, text, text, text, text, text, integer, integer, uuid, boolean, text, timestamptz,"
        " timestamptz, integer)",
    )
    many = await conn.fetchrow(
        sql,
        "queen.pop_many_v1(text, text, text[], text[], integer[], integer[], uuid[], boolean[], text[],"
        " timestamptz[], integer[])",
    )
    assert len(one["names"]) == 15
    assert (many["names"], many["types"]) == (["member", *one["names"]], ["integer", *one["types"]])


async def leases(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    """Each group's leased cursor rows."""
    rows = await conn.fetch(
        "SELECT consumer_group, count(*) FILTER (WHERE lease_id IS NOT NULL) AS leased FROM queen.log_consumers"
        " GROUP BY 1 ORDER BY 1"
    )
    return [(r["consumer_group"], r["leased"]) for r in rows]


async def lock_waits(conn: asyncpg.Connection) -> bool:
    """Whether some backend waits for a lock (here: for the queue row the test holds)."""
    return bool(await conn.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"))


async def hold_queue_row(conn: asyncpg.Connection, queue: str) -> None:
    """Inside ``conn``'s transaction: a claim that creates a group on ``queue`` waits until it ends."""
    await conn.execute("SELECT 1 FROM queen.queues WHERE name = $1 FOR UPDATE", queue)


def pop_task(fuser: Fuser, group: str, auto_ack: bool = False) -> asyncio.Task[list[Record]]:
    call = pop_engine.PopCall(request("q", group, auto_ack=auto_ack), uuid.uuid4())
    return asyncio.create_task(fuser.pop("default", call, False))


async def waiting_in_lane(
    db: Database, group: str, auto_ack: bool = False
) -> tuple[Fuser, Lane[pop_engine.PopCall, list[Record]], asyncio.Task[list[Record]]]:
    """Queue "q" filled, and a fuser whose pop lane holds a pop of ``group`` waiting for a second member."""
    await fill(db, "q")
    fuser = Fuser(db, FuseConfig(max_items=2, **FULL_ONLY))
    lane = fuser.pop_lane("default", "q", False)
    task = pop_task(fuser, group, auto_ack)
    await eventually(lambda: lane.queued == 1, "the pop to wait in the lane")
    return fuser, lane, task


async def goes_away(task: asyncio.Task[list[Record]]) -> None:
    """The request of ``task`` goes away (cancelled, as when its handler is)."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_pop_that_goes_away_while_its_fused_call_runs_gives_its_lease_back(
    db: Database, conn: asyncpg.Connection
) -> None:
    fuser, lane, gone = await waiting_in_lane(db, "gone")
    async with conn.transaction():
        await hold_queue_row(conn, "q")  # both groups are new: the fused call waits to create them
        stays = pop_task(fuser, "stays")
        await until(lambda: lock_waits(conn), "the fused call to wait for the queue row")
        await goes_away(gone)  # while its fused call runs
    got = await stays
    await fuser.close()  # the give-backs done
    assert (lane.stats.calls, lane.stats.requests, lane.stats.isolated) == (1, 2, 0)
    assert shape(got) == [("p0", 0, 4, 0, 1, 0)]
    assert await leases(conn) == [("gone", 0), ("stays", 1)]


async def test_an_auto_ack_pop_that_goes_away_before_its_call_takes_nothing(db: Database) -> None:
    # Under autoAck the claim is the delivery: a pop whose request went away while it waited in the lane
    # must not be claimed for (as an unfused pop cancelled before its call claims nothing), or its
    # messages are acked for nobody.
    fuser, lane, gone = await waiting_in_lane(db, "gone", auto_ack=True)
    await goes_away(gone)
    stays = await pop_task(fuser, "stays", auto_ack=True)
    await fuser.close()
    assert shape(stays) == [("p0", 0, 4, 0, 1, 0)]
    again = await pop_engine.fetch_alone(
        db, "default", pop_engine.PopCall(request("q", "gone", auto_ack=True), uuid.uuid4()), False
    )
    assert shape(again) == [("p0", 0, 4, 0, 1, 0)]  # nothing of "gone"'s was consumed
    assert (lane.stats.calls, lane.stats.requests) == (1, 1)  # the batch left with "stays" alone


async def test_a_pop_that_goes_away_during_its_retry_alone_gives_its_lease_back(
    db: Database, conn: asyncpg.Connection
) -> None:
    fuser, lane, gone = await waiting_in_lane(db, "gone")
    async with conn.transaction():
        await hold_queue_row(conn, "q")  # "gone" is a new group: its claim alone waits to create it
        bad = pop_task(fuser, "b\x00ad")  # fills the batch; the fused call fails at once (a NUL byte)
        await until(lambda: lock_waits(conn), "the retry alone to wait for the queue row")
        assert lane.stats.isolated == 1
        await goes_away(gone)  # while its retry alone runs
    with pytest.raises(QueenError):
        await bad
    await fuser.close()  # the give-backs done
    assert lane.stats.calls == 3  # the fused call, then each member alone
    assert await leases(conn) == [("gone", 0)]


async def test_idle_lanes_are_dropped_by_one_pass_per_half_idle_time(db: Database) -> None:
    # Pop lanes are per queue, so a broker may hold thousands; a pass over all of them on every new lane
    # (every first pop of a queue, or after a minute idle) made the creation cost grow with the queues.
    now = [0.0]
    fuser = Fuser(db, FuseConfig(lane_idle_s=60.0), clock=lambda: now[0])
    for n in range(100):
        fuser.pop_lane("default", f"q{n}", False)
    assert fuser.sweeps == 1  # the first creation's pass; the 99 after it within the half idle time: none
    now[0] = 59.0
    fuser.pop_lane("default", "young", False)
    assert (fuser.sweeps, fuser.dropped) == (2, 0)  # a pass, but nothing idle for the whole minute yet
    now[0] = 61.0
    late = fuser.pop_lane("default", "late", False)
    assert (fuser.sweeps, fuser.dropped) == (2, 0)  # within half the idle time of the last pass: none
    now[0] = 89.0
    fuser.pop_lane("default", "later", False)
    assert (fuser.sweeps, fuser.dropped) == (3, 100)  # the first hundred went; "young" (idle 30 s) stays
    assert {lane.name for lane in fuser.lanes()} == {"pop"} and len(fuser.lanes()) == 3
    assert fuser.pop_lane("default", "late", False) is late
