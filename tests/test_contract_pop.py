"""docs/wire.md#subscription (subscriptionMode/subscriptionFrom) and docs/wire.md#lease-seconds (pop leaseSeconds),
with both official
clients where they can express the rule, raw HTTP and time passed into queen.pop_v1 otherwise."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import pop, push, push_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POP_LEASE = (
    "SELECT * FROM queen.pop_v1('default', $1, NULL, NULL, NULL, 'g', 10, 1, gen_random_uuid(), false, "
    "NULL, NULL, $2, $3)"
)


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


# --- docs/wire.md#subscription subscriptionMode / subscriptionFrom ---------------------------------------------------


@pytest.mark.parametrize("mode", ["all", "from_beginning", "sometimes", "ALL"])
async def test_every_other_mode_reads_from_the_first_retained_message(http: httpx.AsyncClient, mode: str) -> None:
    await push(http, "sm", [{"payload": "old"}])
    ans = await pop(http, "sm", consumerGroup="g", subscriptionMode=mode, batch=10)
    assert ans is not None, f"subscriptionMode={mode} must not be a 400 nor skip the backlog"
    assert [m["data"] for m in ans["messages"]] == ["old"]


@pytest.mark.parametrize(
    "params",
    [
        {"subscriptionMode": "new"},
        {"subscriptionMode": "new-only"},
        {"subscriptionFrom": "now"},
        {"subscriptionMode": "all", "subscriptionFrom": "now"},
    ],
)
async def test_new_new_only_and_from_now_skip_the_backlog(http: httpx.AsyncClient, params: dict[str, str]) -> None:
    await push(http, "sn", [{"payload": "before"}])
    assert await pop(http, "sn", consumerGroup="late", batch=10, **params) is None
    await push(http, "sn", [{"payload": "after"}])
    ans = await pop(http, "sn", consumerGroup="late", batch=10, **params)
    assert [m["data"] for m in ans["messages"]] == ["after"]


async def test_a_from_timestamp_wins_over_the_mode(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push_at(conn, "sf", ["a"], T0)
    await push_at(conn, "sf", ["b"], T0 + timedelta(seconds=10))
    ts = (T0 + timedelta(seconds=5)).isoformat()
    # `new` alone would skip both; `all` alone would read both: the timestamp decides
    for group, mode in (("g1", "new"), ("g2", "from_beginning")):
        ans = await pop(http, "sf", consumerGroup=group, subscriptionMode=mode, subscriptionFrom=ts, batch=10)
        assert [m["transactionId"] for m in ans["messages"]] == ["b"], mode
    stored = await conn.fetch("SELECT name, subscription_mode, subscribed_from FROM queen.log_groups ORDER BY name")
    assert [(r["name"], r["subscription_mode"], r["subscribed_from"]) for r in stored] == [
        ("g1", "from", T0 + timedelta(seconds=5)),
        ("g2", "from", T0 + timedelta(seconds=5)),
    ]


async def test_a_bad_subscription_from_is_still_a_400_and_creates_no_group(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "sb", [{"payload": 1}])
    r = await http.get("/api/v1/pop/queue/sb", params={"consumerGroup": "g", "subscriptionFrom": "yesterday"})
    assert r.status_code == 400 and r.json()["code"] == "bad_request"
    assert await conn.fetchval("SELECT count(*) FROM queen.log_groups") == 0


async def test_2x_client_from_beginning_consumer_works_end_to_end(broker: Broker) -> None:
    """Regression: `subscription_mode('from_beginning')` was a 400, which stopped consume()."""
    async with Queen(broker.url) as client:
        await client.queue("fb").create()
        await client.queue("fb").push([{"data": {"i": i}} for i in range(5)])
        seen: list[int] = []

        async def handle(message: dict[str, Any]) -> None:
            seen.append(message["data"]["i"])

        await asyncio.wait_for(
            client.queue("fb")
            .group("fresh")
            .subscription_mode("from_beginning")
            .batch(2)
            .limit(5)
            .each()
            .consume(handle),
            20,
        )
        assert seen == [0, 1, 2, 3, 4]
        # consumed and acked: nothing left for the group
        assert await client.queue("fb").group("fresh").batch(5).wait(False).pop() == []


async def test_2x_client_new_only_consumer_skips_the_backlog(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        await client.queue("no").create()
        await client.queue("no").push([{"data": "old"}])
        q = client.queue("no").group("tail").subscription_mode("new-only").batch(5).wait(False)
        assert await q.pop() == []
        await client.queue("no").push([{"data": "fresh"}])
        assert [m["data"] for m in await q.pop()] == ["fresh"]


# --- docs/wire.md#lease-seconds pop leaseSeconds ----------------------------------------------------------------------


async def test_lease_seconds_sets_this_claim_s_lease(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "ls", [{"payload": 1}])
    ans = await pop(http, "ls", consumerGroup="g", leaseSeconds=7)
    assert ans is not None
    span = await conn.fetchval("SELECT lease_expires_at - claimed_at FROM queen.log_consumers WHERE consumer_group='g'")
    assert span == timedelta(seconds=7)  # the queue's leaseTime is 300
    await push(http, "ls", [{"payload": 2}])
    await pop(http, "ls", consumerGroup="h")  # without it: the queue's leaseTime
    span = await conn.fetchval("SELECT lease_expires_at - claimed_at FROM queen.log_consumers WHERE consumer_group='h'")
    assert span == timedelta(seconds=300)


async def test_a_one_second_lease_expires_and_the_message_is_claimable_again(conn: asyncpg.Connection) -> None:
    await push_at(conn, "l1", ["m"], T0)
    first = await conn.fetch(POP_LEASE, "l1", T0 + timedelta(seconds=1), 1)
    assert [r["lease_start"] for r in first] == [0]
    assert first[0]["lease_expires_at"] == T0 + timedelta(seconds=2)
    # within the second: still leased, nothing to claim
    assert await conn.fetch(POP_LEASE, "l1", T0 + timedelta(seconds=1.999), None) == []
    # at expiry: claimable again, as a second delivery attempt (with the queue's 300 s this is minutes away)
    again = await conn.fetch(POP_LEASE, "l1", T0 + timedelta(seconds=2), None)
    assert [(r["lease_start"], r["attempts"]) for r in again] == [(0, 2)]
    assert again[0]["lease_expires_at"] == T0 + timedelta(seconds=302)


async def test_an_ack_under_an_expired_one_second_lease_is_refused(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await push(http, "lf", [{"payload": 1, "transactionId": "t"}])
    (m,) = (await pop(http, "lf", consumerGroup="g", leaseSeconds=1))["messages"]
    # move the lease into the past instead of sleeping a second
    await conn.execute("UPDATE queen.log_consumers SET lease_expires_at = lease_expires_at - interval '1 second'")
    ack = await http.post(
        "/api/v1/ack",
        json={"transactionId": "t", "partitionId": m["partitionId"], "leaseId": m["leaseId"], "consumerGroup": "g"},
    )
    assert ack.json()[0]["success"] is False
    (again,) = (await pop(http, "lf", consumerGroup="g"))["messages"]
    assert again["transactionId"] == "t" and again["leaseId"] != m["leaseId"]
