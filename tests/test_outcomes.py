"""The outcome window (sql/procedures/096_outcomes.sql): a request carrying Idempotency-Key (or
X-Request-Id) that was already answered within the window gets the recorded answer again instead of being
applied twice: KV, locks, transactions, acks and pushes, over real HTTP and across two brokers on one
database. Time moves through p_now (the engine's ``now``), never by sleeping."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.api.kv.ops import validate_kv_ops
from queen_pg.db import locks
from queen_pg.db.pool import Database
from queen_pg.engine import kv as kv_engine
from queen_pg.engine.outcomes import Once, body_hash
from queen_pg.errors import QueenError
from queen_pg.jobs.outcomes import OutcomesPrune
from tests.conftest import Broker
from tests.helpers import pop, push

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
INCR = {"operations": [{"op": "incr", "ns": "n", "key": "c", "delta": 1, "forever": True}]}


async def counter(conn: asyncpg.Connection, key: str = "c") -> Any:
    return await conn.fetchval("SELECT value::text::numeric FROM queen.kv WHERE ns = 'n' AND key = $1", key)


async def test_kv_incr_under_one_key_applies_once_and_answers_alike(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    first = await http.post("/api/v1/kv", json=INCR, headers={"Idempotency-Key": "k-1"})
    again = await http.post("/api/v1/kv", json=INCR, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 200, again.text
    assert first.json()["results"][0]["value"] == 1
    assert again.content == first.content
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert await counter(conn) == 1
    # X-Request-Id is a key too; a new key is a new request
    third = await http.post("/api/v1/kv", json=INCR, headers={"X-Request-Id": "k-2"})
    assert third.json()["results"][0]["value"] == 2
    assert await counter(conn) == 2


async def test_a_request_without_a_key_is_unaffected(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    for expected in (1, 2):
        r = await http.post("/api/v1/kv", json=INCR)
        assert r.json()["results"][0]["value"] == expected
        assert "idempotent-replayed" not in r.headers
    assert await counter(conn) == 2
    assert await conn.fetchval("SELECT count(*) FROM queen.request_outcomes") == 0


async def test_same_key_with_another_body_or_route_is_422(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    assert (await http.post("/api/v1/kv", json=INCR, headers={"Idempotency-Key": "k"})).status_code == 200
    other = {"operations": [{"op": "incr", "ns": "n", "key": "c", "delta": 5, "forever": True}]}
    r = await http.post("/api/v1/kv", json=other, headers={"Idempotency-Key": "k"})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "idempotency_key_reused"
    r = await http.post(
        "/api/v1/locks", json={"operations": [{"op": "get", "name": "l"}]}, headers={"Idempotency-Key": "k"}
    )
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused", r.text
    tx = {"operations": [{"type": "push", "items": [{"queue": "q", "payload": 1}]}]}
    r = await http.post("/api/v1/transaction", json=tx, headers={"Idempotency-Key": "k"})
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused", r.text
    assert await counter(conn) == 1
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == 0
    # a key longer than 255 bytes is refused before anything happens
    r = await http.post("/api/v1/kv", json=INCR, headers={"Idempotency-Key": "x" * 256})
    assert r.status_code == 400, r.text
    assert await counter(conn) == 1


async def test_a_transaction_under_one_key_commits_once(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    body = {
        # no transactionId: dedup cannot catch the repeat, only the outcome window can
        "operations": [{"type": "push", "items": [{"queue": "q", "payload": {"n": 1}}, {"queue": "q", "payload": 2}]}],
        "kv": [{"op": "incr", "ns": "n", "key": "c", "forever": True}],
    }
    first = await http.post("/api/v1/transaction", json=body, headers={"Idempotency-Key": "step-1"})
    again = await http.post("/api/v1/transaction", json=body, headers={"Idempotency-Key": "step-1"})
    assert first.status_code == again.status_code == 200, again.text
    answer = first.json()
    assert answer["success"] is True
    assert [r["status"] for r in answer["results"][:2]] == ["queued", "queued"]
    assert answer["results"][0]["transactionId"] == answer["results"][0]["messageId"]
    assert again.json() == answer  # same transactionId, message ids, offsets, KV result
    assert again.headers["idempotent-replayed"] == "true"
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions") == 2
    assert await counter(conn) == 1
    # without the key the same body commits again
    third = await http.post("/api/v1/transaction", json=body)
    assert third.json()["success"] is True
    assert await conn.fetchval("SELECT next_offset FROM queen.log_partitions") == 4


async def test_a_rolled_back_verdict_records_nothing_and_a_retry_decides_again(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    body = {
        "operations": [{"op": "put", "ns": "n", "key": "c", "value": 1, "expect": 0, "required": True, "forever": True}]
    }
    await conn.execute(
        "INSERT INTO queen.kv (tenant, ns, key, value, version, created_at, updated_at)"
        " VALUES ('default', 'n', 'c', '7', nextval('queen.kv_version_seq'), now(), now())"
    )
    lost = await http.post("/api/v1/kv", json=body, headers={"Idempotency-Key": "p"})
    assert lost.status_code == 200 and lost.json()["ok"] is False, lost.text
    assert await conn.fetchval("SELECT count(*) FROM queen.request_outcomes") == 0
    await conn.execute("DELETE FROM queen.kv")
    won = await http.post("/api/v1/kv", json=body, headers={"Idempotency-Key": "p"})
    assert won.json()["results"][0]["applied"] is True, won.text
    assert "idempotent-replayed" not in won.headers
    assert await counter(conn) == 1


async def test_after_the_window_the_key_applies_again(db: Database, conn: asyncpg.Connection) -> None:
    ops = validate_kv_ops(INCR["operations"], in_transaction=False)

    def once() -> Once:
        return Once("k", "kv", body_hash(b"body"), 60)

    async def incr(now: datetime) -> tuple[Any, bool]:
        o = once()
        out = await kv_engine.apply(db, "default", ops, now, once=o)
        return out["results"][0]["value"], o.replayed

    assert await incr(T0) == (1, False)
    assert await incr(T0 + 59 * S) == (1, True)
    assert await incr(T0 + 60 * S) == (2, False)  # the record expired at T0 + 60 s
    assert await incr(T0 + 61 * S) == (2, True)  # the new record, written at T0 + 60 s
    assert await counter(conn) == 2
    with pytest.raises(QueenError) as err:
        await kv_engine.apply(db, "default", ops, T0 + 62 * S, once=Once("k", "kv", body_hash(b"other"), 60))
    assert err.value.code == "idempotency_key_reused" and err.value.status == 422


async def test_two_brokers_apply_one_key_once(start_broker: Any, conn: asyncpg.Connection) -> None:
    brokers: list[Broker] = [await start_broker(jobs_enabled=False) for _ in range(2)]
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{b.url}/api/v1/kv", json=INCR, headers={"Idempotency-Key": f"both-{n}"})
                for n in range(5)
                for b in brokers
            )
        )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    for n in range(5):
        pair = answers[2 * n : 2 * n + 2]
        assert pair[0].content == pair[1].content  # one applied, the other replayed its answer
        assert sorted(a.headers.get("idempotent-replayed", "no") for a in pair) == ["no", "true"]
    assert await counter(conn) == 5
    assert sorted(a.json()["results"][0]["value"] for a in answers[::2]) == [1, 2, 3, 4, 5]


async def test_an_ack_under_one_key_is_answered_as_the_first_time(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "q", [{"transactionId": "m1", "payload": 1}, {"transactionId": "m2", "payload": 2}])
    got = await pop(http, "q", batch=2)
    m = got["messages"][0]
    item = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
    failed = {**item, "status": "failed", "error": "boom"}
    first = await http.post("/api/v1/ack", json=failed, headers={"Idempotency-Key": "a-1"})
    again = await http.post("/api/v1/ack", json=failed, headers={"Idempotency-Key": "a-1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert first.json()[0]["success"] is True and first.json()[0]["leaseReleased"] is True
    # the retry budget was charged once, not twice
    assert await conn.fetchval("SELECT failures FROM queen.log_consumers") == 1
    # the batch route is another route: the same key there is refused
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [failed]}, headers={"Idempotency-Key": "a-1"})
    assert r.status_code == 422, r.text


async def test_a_push_under_one_key_is_applied_once(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    body = {"items": [{"queue": "q", "payload": {"n": 1}}, {"queue": "q", "partition": "p2", "payload": 2}]}
    first = await http.post("/api/v1/push", json=body, headers={"Idempotency-Key": "push-1"})
    again = await http.post("/api/v1/push", json=body, headers={"Idempotency-Key": "push-1"})
    assert first.status_code == again.status_code == 201, again.text
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert [r["index"] for r in first.json()] == [0, 1]
    assert await conn.fetchval("SELECT sum(next_offset) FROM queen.log_partitions") == 2


async def test_concurrent_duplicates_on_one_broker_apply_once(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    answers = await asyncio.gather(
        *(http.post("/api/v1/kv", json=INCR, headers={"Idempotency-Key": "same"}) for _ in range(8))
    )
    assert {a.content for a in answers} == {answers[0].content}
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 7
    assert await counter(conn) == 1


async def test_prune_job_deletes_dead_records_one_replica_at_a_time(
    db: Database, conn: asyncpg.Connection, db_url: str
) -> None:
    ops = validate_kv_ops(INCR["operations"], in_transaction=False)
    for n in range(3):
        await kv_engine.apply(db, "default", ops, T0 + n * S, once=Once(f"k{n}", "kv", body_hash(b"b"), 60))
    job = OutcomesPrune()
    assert await job.run_once(db, T0 + 59 * S) == 0  # all still live
    other = await asyncpg.connect(db_url)
    try:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock($1)", locks.OUTCOMES_PRUNE_LOCK)
            assert await job.run_once(db, T0 + 120 * S) == 0  # another replica leads this tick
    finally:
        await other.close()
    assert await job.run_once(db, T0 + 61 * S) == 2  # k0 and k1 are dead; k2 lives until T0 + 62 s
    assert await conn.fetchval("SELECT array_agg(request_key) FROM queen.request_outcomes") == ["k2"]
