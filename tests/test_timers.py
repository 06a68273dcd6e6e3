"""Timers (docs/wire.md#timers) against a real PostgreSQL and real HTTP: schedule, peek, list, cancel, the firing
job (exactly once, at the deliverAt edge, against cancels and writers holding the key), the 400s, and
the official client end to end. The broker's own jobs are off; each test fires by calling the job's
``run_once`` with its own clock (p_now), never sleeping for time to pass."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import zstandard
from queen import Queen
from queen.errors import TimerError

from queen_pg.db import locks
from queen_pg.db.pool import Database
from queen_pg.jobs.timers import TimersJob
from tests.conftest import Broker
from tests.helpers import eventually, pop, push, until

MS = timedelta(milliseconds=1)
HOUR = timedelta(hours=1)


@pytest.fixture
async def broker(start_broker: Any) -> Broker:
    """Jobs off: every test fires timers by hand with its own clock."""
    b: Broker = await start_broker(jobs_enabled=False)
    return b


def b64(value: Any) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def op(queue: str, key: str, data: Any = None, delay_ms: int = 60_000, txn: str | None = None, **extra: Any) -> Any:
    return {
        "op": "schedule",
        "queue": queue,
        "timerKey": key,
        "payload": b64({"key": key} if data is None else data),
        "delayMs": delay_ms,
        "txn": txn or str(uuid.uuid4()),
        **extra,
    }


async def schedule(http: httpx.AsyncClient, *ops: Any) -> list[Any]:
    r = await http.post("/api/v1/timers", json={"operations": list(ops)})
    assert r.status_code == 200, r.text
    results: list[Any] = r.json()["results"]
    assert len(results) == len(ops)
    return results


def at(result: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(result["deliverAt"].replace("Z", "+00:00"))


def fire_job(sink: list[tuple[str, str]] | None = None) -> TimersJob:
    return TimersJob() if sink is None else TimersJob(lambda tenant, queue: sink.append((tenant, queue)))


async def messages(conn: asyncpg.Connection, queue: str) -> int:
    n: int = await conn.fetchval(
        "SELECT coalesce(sum(p.next_offset), 0) FROM queen.log_partitions p"
        " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1",
        queue,
    )
    return n


async def test_schedule_peek_list_in_pages_and_cancel(http: httpx.AsyncClient) -> None:
    keys = ["a/1", "a/2", "b", "c", "d/e/f"]
    results = await schedule(http, *(op("q", k, txn=f"t-{k}") for k in keys))
    for k, res in zip(keys, results, strict=True):
        assert res["ok"] is True and res["status"] == "scheduled"
        assert (res["queue"], res["timerKey"], res["txn"]) == ("q", k, f"t-{k}")
        assert uuid.UUID(res["messageId"]).version == 7

    r = await http.get("/api/v1/timers/q/d/e/f")
    peek = r.json()
    assert r.status_code == 200 and peek["found"] is True and "fired" not in peek
    assert peek["data"] == {"key": "d/e/f"} and "payload" not in peek  # the payload once, as JSON
    assert (peek["txn"], peek["messageId"], peek["partition"]) == ("t-d/e/f", results[4]["messageId"], "Default")
    assert peek["deliverAt"] == results[4]["deliverAt"]
    assert (await http.get("/api/v1/timers/q/nope")).json() == {"found": False}

    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params = {"limit": 2} | ({"after": after} if after else {})
        page = (await http.get("/api/v1/timers/q", params=params)).json()
        pages += 1
        seen += [row["timerKey"] for row in page["rows"]]
        assert all(set(row) == {"timerKey", "txn", "deliverAt", "messageId", "partition"} for row in page["rows"])
        if not page["truncated"]:
            assert page["nextAfter"] is None
            break
        after = page["nextAfter"]
    assert seen == sorted(keys) and pages == 3

    r = await http.delete("/api/v1/timers/q/a/1")
    assert r.status_code == 200 and r.json()["ok"] is True
    assert (r.json()["status"], r.json()["txn"]) == ("cancelled", "t-a/1")
    assert (await http.get("/api/v1/timers/q/a/1")).json() == {"found": False}
    again = (await http.delete("/api/v1/timers/q/a/1")).json()
    assert (again["ok"], again["status"], again["txn"]) == (False, "absent", None)
    assert [row["timerKey"] for row in (await http.get("/api/v1/timers/q")).json()["rows"]] == keys[1:]


async def test_a_second_schedule_replaces_the_timer(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    [first] = await schedule(http, op("q", "k", {"v": 1}, delay_ms=60_000, txn="t1"))
    [second] = await schedule(http, op("q", "k", {"v": 2}, delay_ms=120_000, txn="t2"))
    assert (second["ok"], second["status"], second["txn"]) == (True, "rescheduled", "t2")
    assert second["messageId"] != first["messageId"] and at(second) > at(first)
    rows = (await http.get("/api/v1/timers/q")).json()["rows"]
    assert [(r["txn"], r["deliverAt"]) for r in rows] == [("t2", second["deliverAt"])]
    assert (await http.get("/api/v1/timers/q/k")).json()["data"] == {"v": 2}
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 1

    # the same schedule sent again (a client retry) keeps the message id it promised
    [resent] = await schedule(http, op("q", "k", {"v": 2}, delay_ms=120_000, txn="t2"))
    assert resent["status"] == "rescheduled" and resent["messageId"] == second["messageId"]
    # "reschedule" is the same upsert; on a new key it schedules
    [fresh] = await schedule(http, op("q", "k2", op="reschedule"))
    assert fresh["status"] == "scheduled"


async def test_fires_exactly_at_deliver_at_as_the_promised_message(
    http: httpx.AsyncClient, db: Database, conn: asyncpg.Connection
) -> None:
    [res] = await schedule(http, op("fire", "k", {"order": 7, "s": "é"}, delay_ms=30_000, txn="tx-7"))
    woken: list[tuple[str, str]] = []
    job = fire_job(woken)
    assert await job.run_once(db, now=at(res) - MS) == 0
    assert await messages(conn, "fire") == 0 and woken == []

    assert await job.run_once(db, now=at(res)) == 1
    assert woken == [("default", "fire")]
    answer = await pop(http, "fire", batch=10, wait=False)
    assert answer is not None
    [msg] = answer["messages"]
    assert (msg["transactionId"], msg["id"], msg["data"]) == ("tx-7", res["messageId"], {"order": 7, "s": "é"})
    # no tombstone (docs/wire.md#timers-no-tombstone): the fire deleted the row
    assert (await http.get("/api/v1/timers/fire/k")).json() == {"found": False}
    assert (await http.get("/api/v1/timers/fire")).json()["rows"] == []
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0


async def test_firing_twice_in_a_row_or_racing_pushes_once(
    http: httpx.AsyncClient, db: Database, db_url: str, conn: asyncpg.Connection
) -> None:
    [res] = await schedule(http, op("twice", "k", delay_ms=-1))
    later = at(res) + timedelta(seconds=1)
    job = fire_job()
    assert [await job.run_once(db, now=later), await job.run_once(db, now=later)] == [1, 0]
    assert await messages(conn, "twice") == 1

    await schedule(http, *(op("race", f"k{i}", delay_ms=0) for i in range(20)))
    other = Database(db_url, 2)
    await other.open(apply_schema=False)
    try:
        done = await asyncio.gather(job.run_once(db, now=later), fire_job().run_once(other, now=later))
    finally:
        await other.close()
    assert sorted(done) == [0, 20]  # one leader fires; the other is not the leader, or finds nothing left
    assert await messages(conn, "race") == 20
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0


async def test_a_timer_whose_txn_is_already_in_the_partition_pushes_nothing(
    http: httpx.AsyncClient, db: Database, conn: asyncpg.Connection
) -> None:
    await push(http, "dup", [{"transactionId": "same", "payload": {"first": True}}])
    [res] = await schedule(http, op("dup", "k", {"second": True}, delay_ms=0, txn="same"))
    assert await fire_job().run_once(db, now=at(res)) == 1  # fired, as a duplicate
    assert await messages(conn, "dup") == 1
    answer = await pop(http, "dup", batch=10, wait=False)
    assert answer is not None and [m["data"] for m in answer["messages"]] == [{"first": True}]
    assert (await http.get("/api/v1/timers/dup/k")).json() == {"found": False}  # fired, so gone


async def test_cancel_after_the_fire_is_absent_and_txn_filters(http: httpx.AsyncClient, db: Database) -> None:
    """Once the fire committed there is no row left; too_late is only for a fire in progress
    (docs/wire.md#timers-no-tombstone)."""
    [res] = await schedule(http, op("late", "k", delay_ms=0, txn="t"))
    await fire_job().run_once(db, now=at(res))
    r = (await http.delete("/api/v1/timers/late/k")).json()
    assert (r["ok"], r["status"], r["txn"]) == (False, "absent", None)
    assert (await http.get("/api/v1/timers/late/k")).json() == {"found": False}
    other = (await http.delete("/api/v1/timers/late/k", params={"txn": "other"})).json()
    assert (other["ok"], other["status"], other["txn"]) == (False, "absent", "other")

    await schedule(http, op("late", "p", txn="mine"))
    miss = (await http.delete("/api/v1/timers/late/p", params={"txn": "not-mine"})).json()
    assert (miss["ok"], miss["status"], miss["txn"]) == (False, "absent", "not-mine")
    assert (await http.get("/api/v1/timers/late/p")).json()["found"] is True
    hit = (await http.delete("/api/v1/timers/late/p", params={"txn": "mine"})).json()
    assert (hit["ok"], hit["status"], hit["txn"]) == (True, "cancelled", "mine")

    # a schedule after the fire starts a new timer under the old key
    [again] = await schedule(http, op("late", "k", txn="t2"))
    assert again["status"] == "scheduled"
    peek = (await http.get("/api/v1/timers/late/k")).json()
    assert (peek["found"], peek["txn"]) == (True, "t2")


async def hold_key(conn: asyncpg.Connection, queue: str, key: str, *, shared: bool) -> asyncpg.transaction.Transaction:
    """Hold a timer key's lock in an open transaction: shared as the firing job holds it, exclusive as
    a writer (POST /timers, the transaction) does."""
    tx = conn.transaction()
    await tx.start()
    fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    await conn.execute(  # the timer key's lock: docs/architecture.md#row-lock-order 0b
        f"SELECT {fn}($1, hashtext('default' || E'\\x1f' || $2 || E'\\x1f' || $3))",
        locks.TIMER_KEY_CLASS,
        queue,
        key,
    )
    return tx


async def test_cancel_while_the_fire_holds_the_key_is_too_late_and_the_fire_happens(
    http: httpx.AsyncClient, db: Database, db_url: str, conn: asyncpg.Connection
) -> None:
    [due] = await schedule(http, op("held", "due", delay_ms=-1, txn="t-due"))
    await schedule(http, op("held", "later", delay_ms=3_600_000))
    holder = await asyncpg.connect(db_url)
    try:
        tx = await hold_key(holder, "held", "due", shared=True)
        r = (await http.delete("/api/v1/timers/held/due")).json()
        assert (r["ok"], r["status"], r["txn"]) == (False, "too_late", "t-due")
        await tx.rollback()
        # the firing job holding the key of a timer that is not due leaves it to the cancel
        tx = await hold_key(holder, "held", "later", shared=True)
        r = (await http.delete("/api/v1/timers/held/later")).json()
        assert (r["ok"], r["status"]) == (True, "cancelled")
        await tx.rollback()
    finally:
        await holder.close()
    assert await fire_job().run_once(db, now=at(due) + MS) == 1
    answer = await pop(http, "held", batch=10, wait=False)
    assert answer is not None and [m["transactionId"] for m in answer["messages"]] == ["t-due"]
    assert (await http.get("/api/v1/timers/held/later")).json() == {"found": False}


async def test_cancel_waits_for_a_writer_holding_the_key_then_decides(
    http: httpx.AsyncClient, db: Database, db_url: str, conn: asyncpg.Connection
) -> None:
    [due] = await schedule(http, op("writer", "k", delay_ms=-1))
    holder = await asyncpg.connect(db_url)
    try:
        tx = await hold_key(holder, "writer", "k", shared=False)
        # the firing job skips a key a writer holds ...
        assert await fire_job().run_once(db, now=at(due) + MS) == 0
        # ... and a cancel waits for the writer instead of guessing
        cancel = asyncio.create_task(http.delete("/api/v1/timers/writer/k"))
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND NOT granted"
        await until(lambda: conn.fetchval(waiting, locks.TIMER_KEY_CLASS), "the cancel to wait on the key")
        assert not cancel.done()
        await tx.rollback()
        r = (await cancel).json()
    finally:
        await holder.close()
    assert (r["ok"], r["status"]) == (True, "cancelled")
    assert await fire_job().run_once(db, now=at(due) + MS) == 0
    assert await messages(conn, "writer") == 0


async def test_cancels_during_a_real_fire_are_too_late_and_the_fire_pushes_them(
    http: httpx.AsyncClient, db: Database, db_url: str, conn: asyncpg.Connection
) -> None:
    """The fire is held inside its push (another connection holds the partition's write lock) while
    cancels arrive: each answers too_late at once, and every one of them is pushed. Cancels before the
    fire cancel, and the fire pushes nothing for them."""
    await push(http, "inflight", [{"transactionId": "seed", "payload": 0}])  # the partition exists
    keys = [f"k{i}" for i in range(12)]
    results = await schedule(http, *(op("inflight", k, delay_ms=-1, txn=f"t-{k}") for k in keys))
    for k in keys[:4]:
        assert (await http.delete(f"/api/v1/timers/inflight/{k}")).json()["status"] == "cancelled"
    holder = await asyncpg.connect(db_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT 1 FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = 'inflight' FOR NO KEY UPDATE OF p"
        )
        firing = asyncio.create_task(fire_job().run_once(db, now=max(at(r) for r in results) + MS))
        blocked = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%timers_fire%'"
        await until(lambda: conn.fetchval(blocked), "the fire to wait on the partition")
        answers = await asyncio.gather(*(http.delete(f"/api/v1/timers/inflight/{k}") for k in keys[4:]))
        assert [(a.json()["status"], a.json()["txn"]) for a in answers] == [("too_late", f"t-{k}") for k in keys[4:]]
        assert not firing.done()
        await tx.rollback()
        assert await firing == len(keys) - 4
    finally:
        await holder.close()
    answer = await pop(http, "inflight", batch=100, wait=False)
    assert answer is not None
    assert sorted(m["transactionId"] for m in answer["messages"]) == sorted(["seed"] + [f"t-{k}" for k in keys[4:]])


async def test_a_delivery_time_in_the_past_fires_on_the_first_cycle(
    http: httpx.AsyncClient, db: Database, conn: asyncpg.Connection
) -> None:
    """A negative delay is legal (docs/wire.md#timers-no-tombstone); the job's first cycle after the schedule fires
    it (no time passed in: the job runs at the database's clock, as the broker's job does)."""
    [res] = await schedule(http, op("past", "k", {"late": True}, delay_ms=-3_600_000))
    assert res["ok"] is True and res["status"] == "scheduled"
    assert await fire_job().run_once(db) == 1
    answer = await pop(http, "past", batch=10, wait=False)
    assert answer is not None and [m["data"] for m in answer["messages"]] == [{"late": True}]
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0
    assert (await http.get("/api/v1/timers/past/k")).json() == {"found": False}
    assert (await http.delete("/api/v1/timers/past/k")).json()["status"] == "absent"
    assert await fire_job().run_once(db) == 0  # nothing left to fire, nothing to sweep


async def test_the_broker_s_own_job_fires_a_past_timer(start_broker: Any, conn: asyncpg.Connection) -> None:
    """The same through a running broker's timers job (its first cycle after the schedule)."""
    b: Broker = await start_broker(jobs_enabled=True)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await schedule(http, op("past2", "k", {"n": 1}, delay_ms=-1))

    async def fired() -> bool:
        return await messages(conn, "past2") == 1

    await until(fired, "the timers job to fire the past timer")
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0


async def test_the_fire_wakes_a_parked_pop(start_broker: Any, db: Database) -> None:
    b: Broker = await start_broker(jobs_enabled=False, pop_poll_interval_ms=60_000)
    waiters = b.app.state.queen.waiters
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        [res] = await schedule(http, op("wake", "k", {"hello": 1}, delay_ms=0))
        await push(http, "wake", [{"payload": "seed"}])  # the queue exists; drain it
        assert (await pop(http, "wake", batch=10, wait=False, autoAck=True))["messages"][0]["data"] == "seed"
        parked = asyncio.create_task(pop(http, "wake", batch=10, wait=True, timeout=20_000))
        await eventually(lambda: waiters.parked == 1, "the pop to park")
        assert await TimersJob(waiters.notify).run_once(db, now=at(res)) == 1
        async with asyncio.timeout(5):  # far below the 60 s poll interval: woken, not polled
            answer = await parked
    assert [m["data"] for m in answer["messages"]] == [{"hello": 1}]


async def test_a_zstd_payload_is_stored_decompressed(http: httpx.AsyncClient) -> None:
    raw = zstandard.ZstdCompressor().compress(json.dumps({"big": "x" * 1000}).encode())
    [res] = await schedule(http, op("z", "k", payloadZstd=True) | {"payload": base64.b64encode(raw).decode()})
    assert res["ok"] is True
    assert (await http.get("/api/v1/timers/z/k")).json()["data"] == {"big": "x" * 1000}


def _with(**fields: Any) -> Any:
    return op("q", "k") | fields


BAD: dict[str, tuple[list[Any], str, str]] = {
    "bad base64": ([_with(payload="not base64!")], "bad_base64", "operations[0].payload"),
    "not JSON": ([_with(payload=base64.b64encode(b"{nope").decode())], "not_json", "operations[0].payload"),
    "not UTF-8": ([_with(payload=base64.b64encode(b'"\xff"').decode())], "not_json", "operations[0].payload"),
    "NaN": ([_with(payload=base64.b64encode(b"NaN").decode())], "not_json", "operations[0].payload"),
    "not zstd": ([_with(payloadZstd=True)], "bad_zstd", "operations[0].payload"),
    "duplicate key": ([op("q", "a"), op("q", "b"), op("q", "a")], "duplicate_key", "operations[2]"),
    "messageId": ([_with(messageId=str(uuid.uuid4()))], "server_owned", "operations[0].messageId"),
    "producerSub": ([op("q", "a"), _with(producerSub="me")], "server_owned", "operations[1].producerSub"),
    "tenantId": ([_with(tenantId="t")], "server_owned", "operations[0].tenantId"),
    "deliverAt": ([_with(deliverAt="2030-01-01T00:00:00Z")], "server_owned", "operations[0].deliverAt"),
    "underscore": ([_with(_internal=1)], "server_owned", "operations[0]._internal"),
    "queue too long": ([op("q" * 256, "k")], "too_long", "operations[0].queue"),
    "partition too long": ([_with(partition="p" * 256)], "too_long", "operations[0].partition"),
    "key too long": ([op("q", "k" * 1025)], "too_long", "operations[0].timerKey"),
    "empty key": ([op("q", "")], "bad_field", "operations[0].timerKey"),
    "control char": ([op("q", "a\nb")], "bad_field", "operations[0].timerKey"),
    "unknown op": ([_with(op="explode")], "unknown_op", "operations[0].op"),
    "unknown field": ([_with(delay_ms=5)], "unknown_field", "operations[0].delay_ms"),
    "no delay": ([{k: v for k, v in op("q", "k").items() if k != "delayMs"}], "missing_field", "delayMs"),
    "bool delay": ([_with(delayMs=True)], "bad_field", "operations[0].delayMs"),
    "not an object": (["schedule"], "bad_field", "operations[0]"),
}


async def test_bad_operations_are_400s_and_write_nothing(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    for case, (ops, reason, where) in BAD.items():
        r = await http.post("/api/v1/timers", json={"operations": ops})
        assert r.status_code == 400, (case, r.text)
        body = r.json()
        assert (body["error"], body["code"], body["reason"]) == ("timers_bad_request",) * 2 + (reason,), case
        assert where in body["detail"], (case, body)
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0


async def test_bad_bodies_and_paths_are_400s(http: httpx.AsyncClient) -> None:
    for content in (b"", b"{nope", b"[]", b'{"operations": 5}'):
        r = await http.post("/api/v1/timers", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == "timers_bad_request", content
    for method, path in (("GET", "/api/v1/timers/q/"), ("GET", "/api/v1/timers/")):
        r = await http.request(method, path)
        assert r.status_code == 400 and r.json()["reason"] in ("missing_field", "bad_field"), (method, path)
    r = await http.delete("/api/v1/timers/q")  # no key: no such timer (the queue's collection is not deletable)
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    assert (await http.post("/api/v1/timers", json={"operations": []})).json() == {"results": []}


async def test_a_slash_in_the_queue_name_is_told_apart_from_the_key_path(http: httpx.AsyncClient) -> None:
    await schedule(http, op("team/a", "x/y", {"n": 1}), op("team", "a/x/y", {"n": 2}))
    assert (await http.get("/api/v1/timers/team%2Fa/x/y")).json()["data"] == {"n": 1}
    assert (await http.get("/api/v1/timers/team/a/x/y")).json()["data"] == {"n": 2}
    assert [r["timerKey"] for r in (await http.get("/api/v1/timers/team%2Fa")).json()["rows"]] == ["x/y"]
    assert (await http.delete("/api/v1/timers/team%2Fa/x/y")).json()["status"] == "cancelled"
    assert (await http.get("/api/v1/timers/team/a/x/y")).json()["found"] is True


async def test_end_to_end_with_the_official_client(broker: Broker, db: Database) -> None:
    async with Queen(broker.url) as client:
        first = await client.timers.schedule("e2e", "order:1/expire", {"orderId": 1}, delay=timedelta(minutes=5))
        assert first and first["status"] == "scheduled"
        second = await (
            client.timer("e2e").key("order:2/expire").payload({"orderId": 2}).after(timedelta(minutes=10)).schedule()
        )
        assert second and second["status"] == "scheduled"
        again = await client.timer("e2e").key("order:2/expire").payload({"orderId": 2}).after_ms(1).reschedule()
        assert again["status"] == "rescheduled"
        third = await client.timers.schedule("e2e", "order:3", {"orderId": 3}, delay_ms=60_000)

        peek = await client.timers.peek("e2e", "order:1/expire")
        assert peek and peek["data"] == {"orderId": 1} and peek["txn"] == first["txn"]
        assert not await client.timers.peek("e2e", "missing")
        rows = await client.timers.list_all("e2e", limit=1)
        assert [r["timerKey"] for r in rows] == ["order:1/expire", "order:2/expire", "order:3"]

        cancelled = await client.timers.cancel("e2e", "order:3", txn=third["txn"])
        assert cancelled and cancelled["status"] == "cancelled"
        gone = await client.timers.cancel("e2e", "order:3")
        assert not gone and gone["status"] == "absent"

        with pytest.raises(TimerError) as err:
            await client.timers.batch([client.timers.op.schedule("e2e", "x", b"{not json", delay_ms=0)])
        assert err.value.code == "timers_bad_request" and err.value.reason == "not_json"

        assert await fire_job().run_once(db, now=at(first) + MS) == 2  # order:1 and the rescheduled order:2
        got = await client.queue("e2e").batch(10).wait(False).pop()
        assert sorted(m["data"]["orderId"] for m in got) == [1, 2]
        by_id = {m["data"]["orderId"]: m for m in got}
        assert (by_id[1]["transactionId"], by_id[1]["id"]) == (first["txn"], first["messageId"])
        assert by_id[2]["transactionId"] == again["txn"]
        late = await client.timers.cancel("e2e", "order:1/expire")  # fired: the row is gone
        assert not late and late["status"] == "absent"
        assert not await client.timers.peek("e2e", "order:1/expire")
        assert await client.timers.list_all("e2e") == []
