"""Dead letters put back: at once (not after the dlq_fill job), and only for the consumer groups that
dead-lettered them."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from queen_pg.jobs.dlq_fill import DlqFill
from tests.conftest import Broker
from tests.helpers import ack_one, pop, push


@pytest.fixture
async def broker(start_broker: Any) -> Broker:
    """No background jobs: these tests decide when dlq_fill runs. With the jobs on, the broker's own
    dlq_fill tick raced them (the payload was copied out before the "not copied yet" check, or before
    the test's own DlqFill run found the row), so they failed now and then."""
    b: Broker = await start_broker(jobs_enabled=False)
    return b


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


async def test_requeue_right_after_the_retry_limit_is_consumed(broker: Broker, conn: asyncpg.Connection) -> None:
    """Regression: the requeue answered 503 until the dlq_fill job had copied the payload out. Here no
    job runs at all (the test broker starts none); the segment holds zstd frames of several messages."""
    async with Queen(broker.url) as client:
        await client.queue("rl").config({"retry_limit": 1}).create()
        await client.queue("rl").push(
            [{"data": {"i": i, "blob": "x" * 50}, "transactionId": f"rl-{i}"} for i in range(3)]
        )
        for attempt in range(2):  # fails past the retry limit
            (m,) = await client.queue("rl").group("g").batch(1).wait(False).pop()
            assert m["transactionId"] == "rl-0"
            res = await client.ack([m], False, {"group": "g", "error": f"attempt {attempt}"})
            assert res["success"] is True and res["results"][0]["dlq"] is (attempt == 1)
        assert await conn.fetchval("SELECT payload IS NULL FROM queen.log_dlq") is True  # not copied out
        dead = await client.admin.retry_message(m["partitionId"], "rl-0")
        assert dead["status"] == "requeued" and dead["offset"] == 3 and dead["consumerGroups"] == ["g"]
        assert dead["messageId"] == m["id"]  # the segment's own frame: the same message
        assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 0
        got = await client.queue("rl").group("g").batch(10).wait(False).pop()
        assert [(x["transactionId"], x["data"]) for x in got] == [
            ("rl-1", {"i": 1, "blob": "x" * 50}),
            ("rl-2", {"i": 2, "blob": "x" * 50}),
            ("rl-0", {"i": 0, "blob": "x" * 50}),
        ]
        assert got[2]["offset"] == 3
        res = await client.ack(got, True, {"group": "g"})
        assert res["success"] is True
        assert await client.queue("rl").group("g").batch(10).wait(False).pop() == []


async def test_requeue_after_the_fill_job_still_works(http: httpx.AsyncClient, broker: Broker) -> None:
    await push(http, "fj", [{"payload": {"k": 1}, "transactionId": "a"}])
    (m,) = (await pop(http, "fj", consumerGroup="g"))["messages"]
    assert (await ack_one(http, m, "g", "dlq"))["dlq"] is True
    await DlqFill().tick(broker.app.state.queen.db)  # copies out (first call hands out, second writes)
    await DlqFill().tick(broker.app.state.queen.db)
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/a/retry")
    assert r.status_code == 200 and r.json()["consumerGroups"] == ["g"]
    (again,) = (await pop(http, "fj", consumerGroup="g"))["messages"]
    assert again["data"] == {"k": 1} and again["offset"] == 1


async def test_requeue_goes_only_to_the_group_that_dead_lettered_it(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Regression: a requeued dead letter was delivered to every group, including groups that had
    already completed it."""
    assert (await http.post("/api/v1/configure", json={"queue": "og", "options": {}})).status_code == 200
    assert await pop(http, "og", consumerGroup="late") is None  # the group exists, read nothing yet
    await push(http, "og", [{"payload": i, "transactionId": f"m{i}"} for i in range(2)])
    # `done` completes both; `bad` dead-letters m0; `late` has not read anything yet
    for m in (await pop(http, "og", consumerGroup="done", batch=2))["messages"]:
        assert (await ack_one(http, m, "done"))["success"] is True
    (m0,) = (await pop(http, "og", consumerGroup="bad", batch=1))["messages"]
    assert (await ack_one(http, m0, "bad", "dlq"))["dlq"] is True
    r = await http.post(f"/api/v1/messages/{m0['partitionId']}/m0/retry")
    assert r.status_code == 200 and r.json()["consumerGroups"] == ["bad"]
    # `done` has nothing more to read, and its cursor passed the copy
    assert await pop(http, "og", consumerGroup="done", batch=10) is None
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'done'") == 3
    # `bad` gets m1 and the copy of m0
    got = (await pop(http, "og", consumerGroup="bad", batch=10))["messages"]
    assert [(x["offset"], x["transactionId"]) for x in got] == [(1, "m1"), (2, "m0")]
    # `late` reads m0 and m1 once, not the copy, and its last ack (m1) releases the lease
    got = (await pop(http, "og", consumerGroup="late", batch=10))["messages"]
    assert [(x["offset"], x["transactionId"]) for x in got] == [(0, "m0"), (1, "m1")]
    item = await ack_one(http, got[1], "late")
    assert item["success"] is True and item["leaseReleased"] is True
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'late'") == 3
    assert await pop(http, "og", consumerGroup="late", batch=10) is None
    assert await conn.fetchval("SELECT count(*) FROM queen.log_passes") == 0  # passed rows are gone


async def test_requeue_for_two_groups_that_both_dead_lettered_it(http: httpx.AsyncClient) -> None:
    await push(http, "tg", [{"payload": 1, "transactionId": "x"}])
    for g in ("a", "b"):
        (m,) = (await pop(http, "tg", consumerGroup=g))["messages"]
        assert (await ack_one(http, m, g, "dlq"))["dlq"] is True
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/x/retry")
    assert r.status_code == 200 and r.json()["consumerGroups"] == ["a", "b"]
    for g in ("a", "b"):
        (again,) = (await pop(http, "tg", consumerGroup=g))["messages"]
        assert again["offset"] == 1 and (await ack_one(http, again, g))["success"] is True


async def test_a_late_ack_from_another_group_never_lands_on_the_requeued_copy(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Regression: after a requeue, another group's ack of that transactionId resolved to the copy (the
    oldest occurrence at or above its cursor), an offset that group passes over, and committed its
    cursor past messages it had not read."""
    await push(http, "la", [{"payload": 0, "transactionId": "x"}])
    (m,) = (await pop(http, "la", consumerGroup="other"))["messages"]
    assert (await ack_one(http, m, "other"))["success"] is True  # `other` is done with x (cursor 1)
    (m,) = (await pop(http, "la", consumerGroup="bad"))["messages"]
    assert (await ack_one(http, m, "bad", "dlq"))["dlq"] is True
    await push(http, "la", [{"payload": i, "transactionId": f"m{i}"} for i in (1, 2, 3)])
    r = await http.post(f"/api/v1/messages/{m['partitionId']}/x/retry")
    assert r.status_code == 200 and r.json()["offset"] == 4 and r.json()["consumerGroups"] == ["bad"]
    late = {"transactionId": "x", "partitionId": m["partitionId"], "consumerGroup": "other"}  # no leaseId
    r = await http.post("/api/v1/ack", json=late)
    assert r.status_code == 200 and r.json()[0]["success"] is True and r.json()[0]["noop"] is True, r.text
    cursor = "SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'other'"
    assert await conn.fetchval(cursor) == 1  # not moved past m1..m3
    got = (await pop(http, "la", consumerGroup="other", batch=10))["messages"]
    assert [x["transactionId"] for x in got] == ["m1", "m2", "m3"]
