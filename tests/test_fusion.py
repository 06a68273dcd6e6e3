"""Request fusion (queen_pg/engine/fusion.py): concurrent pushes and acks share one procedure call and get
back exactly their own results; a request that makes the fused call fail fails alone. Engine tests drive
a Fuser against a real PostgreSQL with a batch that leaves when full (deterministic, no timer); HTTP tests
go through a real broker."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from benchmarks.loadgen_binary import binary_push_request
from queen_pg.api.shared.items import AckItem
from queen_pg.db.pool import Database
from queen_pg.engine import binary
from queen_pg.engine.fusion import FuseConfig, Fuser
from queen_pg.engine.push import NewMessage
from queen_pg.errors import QueenError
from tests.conftest import Broker
from tests.helpers import eventually, pop, until

# A batch leaves only when full (inflight 0: nothing goes alone; the hold is far away).
FULL_ONLY = dict(hold_us=60_000_000, inflight=0)


def msg(txn: str | None, partition: str = "p", queue: str = "q") -> NewMessage:
    return NewMessage(queue, partition, b'"x"', txn, None)


async def test_fused_pushes_map_back_exactly(db: Database, conn: asyncpg.Connection) -> None:
    fuser = Fuser(db, FuseConfig(max_items=9, **FULL_ONLY))
    requests = [[msg(f"r{r}-{i}") for i in range(3)] for r in range(3)]  # 9 items: one batch
    answers = await asyncio.gather(*(fuser.push("default", items) for items in requests))
    lane = fuser.push_lane("default")
    assert (lane.stats.calls, lane.stats.requests) == (1, 3)
    for r, answer in enumerate(answers):
        assert [a["index"] for a in answer] == [0, 1, 2]
        assert [a["transactionId"] for a in answer] == [f"r{r}-{i}" for i in range(3)]
        assert [a["offset"] for a in answer] == [3 * r, 3 * r + 1, 3 * r + 2]  # arrival order, gapless
        assert {a["status"] for a in answer} == {"queued"}
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions") == 9
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 1  # one append for all


async def test_a_duplicate_across_fused_requests_gets_the_first_ones_message_id(db: Database) -> None:
    fuser = Fuser(db, FuseConfig(max_items=3, **FULL_ONLY))
    first, second, other = await asyncio.gather(
        fuser.push("default", [msg("same")]),
        fuser.push("default", [msg("same")]),
        fuser.push("default", [msg("same", partition="elsewhere")]),
    )
    assert fuser.push_lane("default").stats.calls == 1
    assert first[0]["status"] == "queued" and second[0]["status"] == "duplicate"
    assert second[0]["messageId"] == first[0]["messageId"] and second[0]["offset"] == first[0]["offset"] == 0
    assert other[0]["status"] == "queued"  # another partition: not a duplicate
    assert other[0]["messageId"] != first[0]["messageId"]


async def test_a_poisoned_member_fails_alone(db: Database, conn: asyncpg.Connection) -> None:
    # A partition name with a NUL byte passes the engine but PostgreSQL text refuses it: the fused call
    # fails as a whole, then every member is retried alone and only the culprit gets the error.
    fuser = Fuser(db, FuseConfig(max_items=5, **FULL_ONLY))
    good_a, bad, good_b = await asyncio.gather(
        fuser.push("default", [msg("a1"), msg("a2")]),
        fuser.push("default", [msg("bad", partition="p\x00oison")]),
        fuser.push("default", [msg("b1"), msg("b2", partition="p2")]),
        return_exceptions=True,
    )
    assert isinstance(bad, QueenError) and bad.status == 500, bad
    assert not isinstance(good_a, BaseException) and not isinstance(good_b, BaseException)
    assert [(a["transactionId"], a["status"], a["offset"]) for a in good_a] == [
        ("a1", "queued", 0),
        ("a2", "queued", 1),
    ]
    assert [(a["index"], a["offset"]) for a in good_b] == [(0, 2), (1, 0)]
    lane = fuser.push_lane("default")
    assert lane.stats.isolated == 1 and lane.stats.calls == 4  # the fused call, then three alone
    rows = await conn.fetch("SELECT name, next_offset FROM queen.log_partitions ORDER BY name")
    assert [(r["name"], r["next_offset"]) for r in rows] == [("p", 3), ("p2", 1)]


async def test_acks_on_one_cursor_row_never_share_a_call(
    db: Database, http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    for part in ("p1", "p2"):
        r = await http.post(
            "/api/v1/push",
            json={"items": [{"queue": "q", "partition": part, "transactionId": f"{part}-{i}"} for i in range(2)]},
        )
        assert r.status_code == 201
    leased = [(await pop(http, "q", partition=p, batch=2))["messages"] for p in ("p1", "p2")]

    def item(m: dict[str, Any], status: str = "completed") -> AckItem:
        return AckItem(m["transactionId"], m["partitionId"], status, "e", None, m["leaseId"])

    fuser = Fuser(db, FuseConfig(max_items=3, hold_us=20_000, inflight=0))
    a, b, c = await asyncio.gather(
        fuser.ack("default", [item(leased[0][0], "failed")]),  # p1
        fuser.ack("default", [item(leased[0][1], "failed")]),  # p1 again: waits for the next batch
        fuser.ack("default", [item(leased[1][0]), item(leased[1][1])]),  # p2: fills batch 1 (3 items)
    )
    lane = fuser.ack_lane("default")
    assert (lane.stats.calls, lane.stats.requests) == (2, 3)
    assert a[0]["success"] is True and a[0]["leaseReleased"] is True
    assert b[0]["success"] is False and "lease" in b[0]["error"]  # after the first, as if sequential
    assert [r["index"] for r in c] == [0, 1] and all(r["success"] for r in c)
    assert c[1]["leaseReleased"] is True
    failures = await conn.fetchval("SELECT failures FROM queen.log_consumers c JOIN queen.log_partitions p"
                                   " ON p.id = c.partition_id WHERE p.name = 'p1'")  # fmt: skip
    assert failures == 1


async def test_no_concurrency_no_wait(db: Database) -> None:
    # natural batching: with nothing running, a request goes at once, whatever the hold
    fuser = Fuser(db, FuseConfig(hold_us=60_000_000, inflight=1))
    async with asyncio.timeout(10):
        for n in range(3):
            answer = await fuser.push("default", [msg(f"t{n}")])
            assert answer[0]["offset"] == n
    assert fuser.push_lane("default").stats.calls == 3


async def test_a_request_that_goes_away_leaves_its_neighbours_alone(db: Database, conn: asyncpg.Connection) -> None:
    fuser = Fuser(db, FuseConfig(max_items=3, **FULL_ONLY))
    lane = fuser.push_lane("default")
    gone = asyncio.create_task(fuser.push("default", [msg("gone")]))
    stays = asyncio.create_task(fuser.push("default", [msg("stays")]))
    await asyncio.sleep(0)  # one loop turn: both tasks joined the open batch
    assert lane.queued == 2
    gone.cancel()
    last = await fuser.push("default", [msg("last")])  # fills the batch: it leaves
    assert last[0]["offset"] == 2
    assert (await stays)[0]["offset"] == 1
    with pytest.raises(asyncio.CancelledError):
        await gone
    await fuser.close()
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions") == 3


async def test_many_concurrent_http_pushes_to_one_partition(start_broker: Any, conn: asyncpg.Connection) -> None:
    broker: Broker = await start_broker(fuse_hold_us=5_000, fuse_inflight=1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:

        async def one(r: int) -> Any:
            items = [{"queue": "q", "partition": "p", "transactionId": f"r{r}-{i}", "payload": i} for i in range(3)]
            if r % 10 == 9:  # a repeat of an earlier request's first item
                items[0]["transactionId"] = "r0-0"
            resp = await http.post("/api/v1/push", json={"items": items})
            assert resp.status_code == 201, resp.text
            return resp.json()

        answers = await asyncio.gather(*(one(r) for r in range(60)))
        parked = asyncio.create_task(http.get("/api/v1/pop/queue/woken", params={"wait": "true", "timeout": 10_000}))
        lane = broker.app.state.queen.fuser.push_lane("default")
        waiters = broker.app.state.queen.waiters
        await eventually(lambda: waiters.parked == 1, "the long poll to park")
        woke = await http.post("/api/v1/push", json={"items": [{"queue": "woken", "payload": 1}]})
        assert woke.status_code == 201
        assert (await parked).status_code == 200  # the fused push still wakes long polls
    assert lane.stats.calls < lane.stats.requests  # fusion happened
    offsets: list[int] = []
    for r, answer in enumerate(answers):
        assert [a["index"] for a in answer] == [0, 1, 2]
        assert [a["transactionId"] for a in answer][1:] == [f"r{r}-1", f"r{r}-2"]
        mine = [a["offset"] for a in answer if a["status"] == "queued"]
        assert mine == list(range(mine[0], mine[0] + len(mine)))  # a request's items stay together
        offsets.extend(mine)
    assert sorted(offsets) == list(range(len(offsets)))  # gapless across every fused call
    # "r0-0" was sent 7 times by concurrent requests: whichever came first is queued, the rest are its duplicates
    repeats = [answers[r][0] for r in (0, 9, 19, 29, 39, 49, 59)]
    assert sorted(a["status"] for a in repeats) == ["duplicate"] * 6 + ["queued"]
    assert len({(a["messageId"], a["offset"]) for a in repeats}) == 1
    assert len(offsets) == 60 * 3 - 6
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions WHERE name = 'p'") == len(offsets)


async def test_a_keyed_request_is_not_fused(start_broker: Any) -> None:
    broker: Broker = await start_broker(jobs_enabled=False)
    lane = broker.app.state.queen.fuser.push_lane("default")
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": "q"}]}, headers={"Idempotency-Key": "k"})
        assert r.status_code == 201
        assert lane.stats.requests == 0
        r = await http.post("/api/v1/push", json={"items": [{"queue": "q"}]})
        assert r.status_code == 201
        assert lane.stats.requests == 1


async def test_fusion_off(start_broker: Any) -> None:
    broker: Broker = await start_broker(fuse_hold_us=0, jobs_enabled=False)
    fuser = broker.app.state.queen.fuser
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        answers = await asyncio.gather(
            *(http.post("/api/v1/push", json={"items": [{"queue": "q", "transactionId": f"t{n}"}]}) for n in range(5))
        )
    assert sorted(a.json()[0]["offset"] for a in answers) == [0, 1, 2, 3, 4]
    assert fuser.lanes() == []


async def test_a_malformed_ack_among_fused_acks_fails_alone(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    # A partitionId beyond bigint passes the body's validation; sent to PostgreSQL it would fail the whole
    # (fused) call. It is refused per item instead, and its neighbours settle.
    parts = [f"p{n}" for n in range(6)]
    for part in parts:
        r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "partition": part, "transactionId": part}]})
        assert r.status_code == 201
    leased = [(await pop(http, "q", partition=p))["messages"][0] for p in parts]
    bad = {"transactionId": "p0", "partitionId": str(2**63), "leaseId": leased[0]["leaseId"]}
    bodies = [bad] + [{k: m[k] for k in ("transactionId", "partitionId", "leaseId")} for m in leased]
    answers = await asyncio.gather(*(http.post("/api/v1/ack", json=b) for b in bodies))
    assert [a.status_code for a in answers] == [200] * 7
    assert answers[0].json()[0]["success"] is False and "unknown partitionId" in answers[0].json()[0]["error"]
    assert all(a.json()[0]["success"] is True for a in answers[1:])
    assert await conn.fetchval("SELECT sum(cursor_offset) FROM queen.log_consumers") == 6
    tx = {"operations": [{"type": "ack", **bad}]}
    r = await http.post("/api/v1/transaction", json=tx)
    assert r.status_code == 200 and r.json()["reason"] == "rejected_ack", r.text


async def _waiting(conn: asyncpg.Connection, n: int) -> bool:
    return await _push_calls_waiting_on_a_lock(conn) == n


async def _push_calls_waiting_on_a_lock(conn: asyncpg.Connection) -> int:
    # pg_stat_activity is read once per transaction, and the caller polls inside the one that holds the
    # row: drop that snapshot first, or a poll made before the calls waited sees the same answer forever
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            " AND datname = current_database()"  # the pool's calls (the hot connection shows no query text)
        )
    )


@pytest.mark.parametrize("max_calls", [1, 2])
async def test_a_ready_batch_waits_for_a_call_slot_and_gathers_the_rest(
    db: Database, conn: asyncpg.Connection, max_calls: int
) -> None:
    # The calls hang on the partition row (held FOR UPDATE here, as a slow concurrent push would): the first
    # request goes alone, the next batches leave at their hold until max_calls run; after that a batch whose
    # hold is over waits for a slot, gathering whoever comes, and leaves as ONE call when a call returns.
    # Without the cap every 20 ms hold launched one more call against the locked row.
    fuser = Fuser(db, FuseConfig(hold_us=20_000, inflight=1, max_calls=max_calls))
    lane = fuser.push_lane("default")
    assert (await fuser.push("default", [msg("seed")]))[0]["offset"] == 0  # the partition exists
    tasks: list[asyncio.Task[Any]] = []
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM queen.log_partitions WHERE name = 'p' FOR UPDATE")
        for n in range(max_calls):  # fill the slots: one call each (the first alone, then one per hold)
            tasks.append(asyncio.create_task(fuser.push("default", [msg(f"slot{n}")])))
            await eventually(lambda n=n: lane.running == n + 1 and lane.queued == 0, "a call to start")
        await until(lambda: _waiting(conn, max_calls), "the calls to wait for the row")
        tasks += [asyncio.create_task(fuser.push("default", [msg(f"late{n}")])) for n in range(8)]
        await eventually(lambda: lane.ready == 8, "the late batch's hold to be over")
        assert lane.running == max_calls and lane.queued == 8  # ready, yet it waits: the lane is full
        assert await _push_calls_waiting_on_a_lock(conn) == max_calls
        tasks.append(asyncio.create_task(fuser.push("default", [msg("later")])))  # joins the waiting batch
        await eventually(lambda: lane.queued == 9, "the last request to join the waiting batch")
        assert lane.running == max_calls
    answers = await asyncio.gather(*tasks)  # the row is free: the slots' calls return, the batch leaves
    assert (lane.stats.calls, lane.stats.requests) == (1 + max_calls + 1, 1 + max_calls + 9)
    offsets = sorted(a[0]["offset"] for a in answers)
    assert offsets == list(range(1, max_calls + 10))  # gapless after the seed
    assert lane.running == 0 and lane.queued == 0


async def test_a_full_batch_waits_for_a_call_slot_too(db: Database, conn: asyncpg.Connection) -> None:
    # max_items makes a batch ready at once; with the one slot taken it waits like an expired one, and the
    # requests after it open the next batch (they leave in turn, one call each time a call returns).
    fuser = Fuser(db, FuseConfig(hold_us=60_000_000, inflight=1, max_calls=1, max_items=3))
    lane = fuser.push_lane("default")
    await fuser.push("default", [msg("seed")])
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM queen.log_partitions WHERE name = 'p' FOR UPDATE")
        first = asyncio.create_task(fuser.push("default", [msg("alone")]))
        await eventually(lambda: lane.running == 1, "the alone call to start")
        rest = [asyncio.create_task(fuser.push("default", [msg(f"r{n}")])) for n in range(5)]
        await eventually(lambda: lane.queued == 5, "the requests to join")
        assert lane.ready == 3 and lane.running == 1  # the first batch is full, the next one is not
    await first
    answers = await asyncio.gather(*rest)
    assert sorted(a[0]["offset"] for a in answers) == [2, 3, 4, 5, 6]
    # the full batch left when the alone call returned, the other one when the full one returned
    assert (lane.stats.calls, lane.stats.requests) == (4, 7)


async def test_fuse_max_calls_reaches_the_lanes(start_broker: Any) -> None:
    broker: Broker = await start_broker(fuse_max_calls=1, jobs_enabled=False)
    assert broker.app.state.queen.fuser.push_lane("default").config.max_calls == 1


def binary_groups(queue: str, partition: int, items: int = 3) -> list[binary.Group]:
    """The groups of one flag-8 binary push body (a framed, zstd blob), as the client sends them."""
    raw = binary_push_request({"queue": queue, "items": items, "tag": f"b{partition}"}, 0, 0, partition)
    return binary.parse_push(raw.split(b"\r\n\r\n", 1)[1], 1 << 20, 10_000).groups


async def test_binary_pushes_fuse_in_a_lane_the_fuser_owns(db: Database, conn: asyncpg.Connection) -> None:
    """Stored-as-is binary pushes share one call through the fuser's own lane: swept when idle and
    closed with the others (it lived beside the fuser, never dropped, never closed)."""
    now = [0.0]
    fuser = Fuser(db, FuseConfig(max_items=3, lane_idle_s=60, **FULL_ONLY), clock=lambda: now[0])
    answers = await asyncio.gather(*(fuser.push_stored("default", binary_groups("bq", p)) for p in range(3)))
    lane = fuser.push_binary_lane("default")
    assert (lane.stats.calls, lane.stats.requests) == (1, 3)
    assert lane in fuser.lanes()
    for p, answer in enumerate(answers):
        assert [a["partition"] for a in answer] == [f"p{p:05d}"] * 3
        assert [a["offset"] for a in answer] == [0, 1, 2] and {a["status"] for a in answer} == {"queued"}
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 3  # one segment per partition
    now[0] = 100.0
    fuser.push_lane("other")  # a new lane sweeps: the idle binary lane goes
    assert lane not in fuser.lanes() and fuser.dropped >= 1
    await fuser.close()
