"""Tenants in the SQL and the process: the timer fire's partition locks in one ascending
order across tenants, a per-tenant share of admission, idle fusion lanes dropped."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.db.pool import Database
from queen_pg.engine import codec
from queen_pg.engine import push as push_engine
from queen_pg.engine import timers as timers_engine
from queen_pg.engine.fusion import FuseConfig, Fuser, Lane
from queen_pg.jobs.dlq_fill import DlqFill
from queen_pg.jobs.kv_sweep import KvSweep
from queen_pg.jobs.lease_expiry import LeaseExpiry
from tests.conftest import Broker
from tests.helpers import eventually, until


async def _partition(db: Database, tenant: str, queue: str) -> int:
    (res,) = await push_engine.push(db, tenant, [push_engine.NewMessage(queue, "Default", b"0", None, None)])
    return int(res["partitionId"])


async def _timer(db: Database, tenant: str, queue: str) -> None:
    op = {"op": "schedule", "queue": queue, "timerKey": "k", "delayMs": 0, "txn": f"{tenant}-t", "partition": "Default"}
    (res,) = await timers_engine.apply(db, tenant, [op], [b'{"t": 1}'], [codec.txn_hash(f"{tenant}-t")], [uuid.uuid4()])
    assert res["status"] == "scheduled"


async def test_timers_of_two_tenants_fire_with_partition_locks_in_one_ascending_order(
    db: Database, db_url: str
) -> None:
    """Tenant "a" fires first (tenants in name order) but its partition has the HIGHER id. A retention
    pass locks partitions ascending across tenants: here a transaction holds b's (low) partition, as
    retention would first, and then asks for a's (high) one. The fire must not hold a's partition while
    it waits for b's: before the fix it did, and this was a deadlock."""
    low = await _partition(db, "b", "qb")
    high = await _partition(db, "a", "qa")
    assert low < high
    await _timer(db, "a", "qa")
    await _timer(db, "b", "qb")

    holder = await asyncpg.connect(db_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SET lock_timeout = '10s'")
        await holder.execute("SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR NO KEY UPDATE", low)
        fire = asyncio.create_task(timers_engine.fire(db, 100, datetime.now(UTC) + timedelta(seconds=1)))

        async def fire_waits() -> bool:
            n = await holder.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%timers_fire%'"
            )
            return bool(n)

        await until(fire_waits, "the fire to wait for the low partition")
        # as retention would next: the higher id. The fire holds no partition yet, so this is granted.
        await holder.execute("SELECT 1 FROM queen.log_partitions WHERE id = $1 FOR NO KEY UPDATE", high)
        await tx.commit()
        result = await asyncio.wait_for(fire, 30)
    finally:
        await holder.close()
    assert result.leader and result.fired == 2
    assert sorted(result.queues) == [("a", "qa"), ("b", "qb")]


async def test_two_tenants_fire_concurrently_with_retention(db: Database, db_url: str) -> None:
    """The fire and the retention job run side by side, over and over, with timers of two tenants whose
    partition ids interleave; neither ever fails (a deadlock would surface as an error)."""
    pids = {}
    for tenant in ("z", "a", "m"):
        pids[tenant] = await _partition(db, tenant, f"q{tenant}")
    other = await asyncpg.connect(db_url)
    try:
        for round_ in range(15):
            for tenant in ("z", "a", "m"):
                op = {
                    "op": "schedule",
                    "queue": f"q{tenant}",
                    "timerKey": f"k{round_}",
                    "delayMs": 0,
                    "txn": f"{tenant}{round_}",
                }
                await timers_engine.apply(
                    db, tenant, [op], [b"1"], [codec.txn_hash(f"{tenant}{round_}")], [uuid.uuid4()]
                )
            later = datetime.now(UTC) + timedelta(seconds=1)
            fired, _ = await asyncio.gather(
                timers_engine.fire(db, 100, later),
                other.fetch("SELECT * FROM queen.retention_v1(100, $1)", later),
            )
            assert fired.fired == 3
    finally:
        await other.close()


# --- admission: a share per tenant ----------------------------------------------------------------

BODY = 64 * 1024  # each held request's Content-Length: the body limit; 16 of them fill the 1 MiB budget exactly


@contextlib.asynccontextmanager
async def held_pushes(broker: Broker, tenant: str, n: int) -> AsyncIterator[None]:
    """``n`` pushes of tenant whose headers announce BODY bytes that never come: each holds its
    admission permits (taken before the body is read) until the connection closes."""
    writers = []
    try:
        for _ in range(n):
            _, w = await asyncio.open_connection("127.0.0.1", broker.port)
            w.write(
                (
                    f"POST /api/v1/push HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                    f"x-queen-tenant: {tenant}\r\ncontent-length: {BODY}\r\n\r\n"
                ).encode()
            )
            await w.drain()
            writers.append(w)
        yield
    finally:
        for w in writers:
            w.close()


@pytest.mark.parametrize("share", [0.5, 1.0])
async def test_one_tenants_flood_does_not_starve_another(start_broker: Any, share: float) -> None:
    b: Broker = await start_broker(
        tenancy_header=True,
        max_body_bytes=64 * 1024,
        admit_max_mb=1,
        admit_hold_ms=400,
        admit_tenant_share=share,
        jobs_enabled=False,
    )
    budget = b.app.state.queen.admission
    async with held_pushes(b, "flood", 30):

        async def flood_in() -> bool:
            # the flood holds all it may: its gate's part with a share, else the whole budget to the
            # last byte (a quiet push then cannot fit, whether or not flood requests still wait)
            if share < 1:
                gate = budget.gates.get("flood")
                return gate is not None and gate.used == budget.tenant_capacity
            return bool(budget.sem.used == budget.capacity)

        await until(flood_in, "the flood to take all the budget it may")
        async with httpx.AsyncClient(base_url=b.url, headers={"x-queen-tenant": "quiet"}) as http:
            r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]})
    if share < 1:
        assert r.status_code == 201, r.text  # the quiet tenant's push went through at once
        assert budget.gates["flood"].used <= budget.tenant_capacity
        assert budget.sem.used <= budget.capacity * share + BODY
    else:  # without a share the flood holds the whole budget: the quiet push finds no room and its hold expires
        assert r.status_code == 429 and r.json()["code"] == "overloaded"


# --- long-poll waiters: a share per tenant ------------------------------------------------------


def _long_polls(http: httpx.AsyncClient, queue: str, n: int) -> list[asyncio.Task[httpx.Response]]:
    params = {"wait": "true", "timeout": 30_000}
    return [asyncio.create_task(http.get(f"/api/v1/pop/queue/{queue}", params=params)) for _ in range(n)]


@pytest.mark.parametrize("tenancy", [True, False])
async def test_one_tenants_parked_pops_leave_room_for_another(start_broker: Any, tenancy: bool) -> None:
    """max_waiters=4 and the default share (0.5): with tenancy on, tenant "flood" parks 2 long-poll
    pops and its other 2 are 429 at once, while tenant "quiet" still parks and is served by its push.
    With tenancy off there are no tenants to share among: all 4 park, the fifth is 429."""
    b: Broker = await start_broker(tenancy_header=tenancy, max_waiters=4, jobs_enabled=False)
    waiters = b.app.state.queen.waiters
    flood = httpx.AsyncClient(base_url=b.url, headers={"x-queen-tenant": "flood"}, timeout=30)
    quiet = httpx.AsyncClient(base_url=b.url, headers={"x-queen-tenant": "quiet"}, timeout=30)
    tasks: list[asyncio.Task[httpx.Response]] = []
    try:
        for http, queue in ((flood, "fq"), (quiet, "qq")):
            assert (await http.post("/api/v1/configure", json={"queue": queue})).status_code == 200
        tasks = _long_polls(flood, "fq", 4)
        await eventually(lambda: waiters.parked + sum(t.done() for t in tasks) == 4, "the flood parked or refused")
        refused = [t.result() for t in tasks if t.done()]
        if not tenancy:
            assert waiters.parked == 4 and refused == []
            r = await quiet.get("/api/v1/pop/queue/qq", params={"wait": "true", "timeout": 30_000})
            assert r.status_code == 429 and r.json()["code"] == "overloaded", r.text
            assert r.json()["error"] == "too many parked long-poll pops on this broker"
            return
        assert waiters.parked == 2, "the flood holds its share and no more"
        assert [r.status_code for r in refused] == [429, 429]
        assert {r.json()["code"] for r in refused} == {"overloaded"}
        assert refused[0].json()["error"] == "too many parked long-poll pops for this tenant on this broker"
        assert refused[0].headers["retry-after"] == "1"
        (served,) = _long_polls(quiet, "qq", 1)
        await eventually(lambda: waiters.parked == 3, "the quiet tenant's pop parked")
        assert (await quiet.post("/api/v1/push", json={"items": [{"queue": "qq", "payload": "hi"}]})).status_code == 201
        r = await served
        assert r.status_code == 200, r.text
        assert [m["data"] for m in r.json()["messages"]] == ["hi"]
        assert waiters.parked == 2 and sum(not t.done() for t in tasks) == 2  # the flood still parked
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await flood.aclose()
        await quiet.aclose()
        await eventually(lambda: waiters.parked == 0, "the parked pops gone with their clients")


# --- fusion lanes: idle ones are dropped ---------------------------------------------------------


async def test_idle_fusion_lanes_are_dropped_and_busy_ones_kept(db: Database) -> None:
    now = [0.0]
    fuser = Fuser(db, FuseConfig(hold_us=2000, lane_idle_s=60), clock=lambda: now[0])
    for i in range(20):
        await fuser.push(f"t{i}", [push_engine.NewMessage("q", "Default", b"1", None, None)])
    assert len(fuser.lanes()) == 20
    release, started = asyncio.Event(), asyncio.Event()

    async def slow(requests: list[list[int]]) -> list[list[dict[str, Any]]]:
        started.set()
        await release.wait()
        return [[] for _ in requests]

    busy: Lane[int] = Lane("push", slow, fuser.config, fuser.clock)
    fuser._push["busy"] = busy  # a lane with a call running
    call = asyncio.create_task(busy.submit([1]))
    await started.wait()  # the lane's call is running
    now[0] = 59.0
    fuser.push_lane("late")  # a sweep: nothing idle long enough yet
    assert len(fuser.lanes()) == 22
    now[0] = 61.0
    fuser.push_lane("early")  # no pass within half the idle time of the last one
    assert fuser.dropped == 0
    now[0] = 89.0
    fuser.push_lane("new")  # a pass: the 20 idle lanes go ("late" and "early", idle under a minute, stay)
    assert sorted(t for t in fuser._push) == ["busy", "early", "late", "new"]
    assert fuser.dropped == 20
    release.set()
    await call
    now[0] = 200.0
    fuser.push_lane("another")
    assert sorted(fuser._push) == ["another"]
    await fuser.close()


async def test_the_lease_kv_and_dlq_jobs_work_for_every_tenant(start_broker: Any, conn: asyncpg.Connection) -> None:
    """The background jobs work for every tenant: two tenants with the same queue, group
    and KV names; one run of lease_expiry, kv_sweep and dlq_fill (time passed to them) clears both
    tenants' expired leases and KV rows and fills both tenants' dead letters."""
    broker: Broker = await start_broker(tenancy_header=True, jobs_enabled=False)
    tenants = ("tenant-a", "tenant-b")
    for t in tenants:
        async with httpx.AsyncClient(base_url=broker.url, headers={"x-queen-tenant": t}, timeout=30) as http:
            items = [{"queue": "q", "payload": {"t": t, "i": i}, "transactionId": f"m{i}"} for i in range(2)]
            assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
            got = (await http.get("/api/v1/pop/queue/q", params={"consumerGroup": "g", "batch": 1})).json()
            (m,) = got["messages"]
            dead = {k: m[k] for k in ("transactionId", "partitionId", "leaseId")}
            r = await http.post("/api/v1/ack", json={**dead, "consumerGroup": "g", "status": "dlq", "error": "x"})
            assert r.status_code == 200 and r.json()[0]["dlq"] is True, r.text
            r = await http.get("/api/v1/pop/queue/q", params={"consumerGroup": "g", "batch": 1})  # leased: m1
            assert r.status_code == 200, r.text
            kv = [{"op": "put", "ns": "n", "key": "k", "value": t, "ttlSeconds": 60}]
            assert (await http.post("/api/v1/kv", json={"operations": kv})).status_code == 200
    per_tenant = """
        SELECT t.tenant,
               (SELECT count(*) FROM queen.log_consumers c JOIN queen.log_partitions p ON p.id = c.partition_id
                 WHERE p.tenant = t.tenant AND c.lease_id IS NOT NULL) AS leases,
               (SELECT count(*) FROM queen.kv k WHERE k.tenant = t.tenant) AS kv,
               (SELECT count(*) FROM queen.log_dlq d WHERE d.tenant = t.tenant AND d.payload IS NULL) AS unfilled
          FROM unnest($1::text[]) AS t(tenant) ORDER BY 1"""
    before = [tuple(r) for r in await conn.fetch(per_tenant, list(tenants))]
    assert before == [(t, 1, 1, 1) for t in tenants], before
    later = datetime.now(UTC) + timedelta(days=1)
    db = broker.app.state.queen.db
    await LeaseExpiry(lambda tenant, queue: None).run_once(db, later)
    await KvSweep().run_once(db, later)
    await DlqFill().tick(db)  # hands the segments out, then writes the payloads
    await DlqFill().tick(db)
    after = [tuple(r) for r in await conn.fetch(per_tenant, list(tenants))]
    assert after == [(t, 0, 0, 0) for t in tenants], after
