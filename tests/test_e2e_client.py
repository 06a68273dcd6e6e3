"""End to end with the official client, queen-mq 2.6.0, against a real broker over HTTP: once with the
client's defaults (JSON), once with its three binary options (docs/wire.md#binary-formats: QPB1 pushes with
client-framed zstd groups, QTB1 transactions, QPF1 framed pops)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from queen import Queen

from tests.conftest import Broker
from tests.helpers import until

PARTITIONS = 10
PER_PARTITION = 100


BINARY = {"binary_push": True, "push_compression": True, "framed_pop": True}


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)


@pytest.fixture(params=["json", "binary"])
def options(request: pytest.FixtureRequest) -> dict[str, bool]:
    """The client's wire: its defaults, or every binary option on."""
    return BINARY if request.param == "binary" else {}


async def _fill(client: Queen, queue: str) -> None:
    await client.queue(queue).create()
    for p in range(PARTITIONS):
        items = [{"data": {"p": p, "i": i}, "transactionId": f"p{p}-{i}"} for i in range(PER_PARTITION)]
        results = await client.queue(queue).partition(f"p{p}").push(items)
        assert [r["status"] for r in results] == ["queued"] * PER_PARTITION


def _check_complete_and_ordered(seen: dict[int, list[int]]) -> None:
    assert sorted(seen) == list(range(PARTITIONS))
    for p, got in seen.items():
        assert got == list(range(PER_PARTITION)), f"partition p{p} out of order or incomplete"


async def test_group_consume_with_manual_ack_delivers_each_once_in_order(
    broker: Broker, options: dict[str, bool]
) -> None:
    async with Queen(broker.url, **options) as client:
        await _fill(client, "e2e")

        seen: dict[int, list[int]] = defaultdict(list)
        ack_failures: list[Any] = []

        async def handle(messages: list[dict[str, Any]]) -> None:
            for m in messages:
                seen[m["data"]["p"]].append(m["data"]["i"])
            res = await client.ack(messages, True, {"group": "billing"})
            if not res.get("success"):
                ack_failures.append(res)

        await (
            client.queue("e2e")
            .group("billing")
            .batch(37)
            .auto_ack(False)
            .limit(PARTITIONS * PER_PARTITION)
            .consume(handle)
        )
        assert ack_failures == []
        _check_complete_and_ordered(seen)
        # everything is acked: nothing is left for this group
        assert await client.queue("e2e").group("billing").batch(10).wait(False).pop() == []

        # a second group reads all 1,000 too, with the client's defaults (autopilot, auto-ack)
        seen2: dict[int, list[int]] = defaultdict(list)

        async def handle2(messages: Any) -> None:
            for m in messages if isinstance(messages, list) else [messages]:
                seen2[m["data"]["p"]].append(m["data"]["i"])

        await client.queue("e2e").group("audit").limit(PARTITIONS * PER_PARTITION).consume(handle2)
        _check_complete_and_ordered(seen2)

        # a pushed duplicate is reported as such
        dups: list[Any] = []

        async def on_dup(items: Any, _err: Exception) -> None:
            dups.extend(items)

        res = (
            await client.queue("e2e")
            .partition("p3")
            .push([{"data": {"again": True}, "transactionId": "p3-7"}])
            .on_duplicate(on_dup)
        )
        assert res[0]["status"] == "duplicate"
        assert len(dups) == 1 and dups[0]["transactionId"] == "p3-7"


async def test_client_single_pop_ack_and_renew(broker: Broker, options: dict[str, bool]) -> None:
    async with Queen(broker.url, **options) as client:
        await client.queue("one").create()
        await client.queue("one").push([{"data": {"x": 1}}])
        (m,) = await client.queue("one").batch(1).wait(False).pop()
        assert m["data"] == {"x": 1}
        renewed = await client.renew(m)
        assert renewed.get("success") is True
        assert (await client.ack(m, True))["success"] is True
        assert await client.queue("one").batch(1).wait(False).pop() == []
        await client.queue("one").delete()


async def test_client_renew_lease_keeps_a_slow_handler_s_lease(broker: Broker, options: dict[str, bool], conn) -> None:  # type: ignore[no-untyped-def]
    async with Queen(broker.url, **options) as client:
        await client.queue("slow").config({"lease_time": 1}).create()
        await client.queue("slow").push([{"data": {"job": 1}, "transactionId": "job-1"}])
        first_expiry = []

        async def renewed_twice() -> bool:
            expiry = await conn.fetchval("SELECT lease_expires_at FROM queen.log_consumers")
            if expiry is None:
                return False
            first_expiry.append(expiry)
            return (expiry - first_expiry[0]).total_seconds() >= 1.0

        async def handle(message: Any) -> None:
            # the handler's "work" lasts until the broker has seen the client renew its 1 s lease twice
            await until(renewed_twice, "two lease renewals", within=20)

        await client.queue("slow").group("g").batch(1).renew_lease(True, 300).limit(1).consume(handle)
        # the auto-ack after the handler was accepted: the lease was still ours, nothing comes back
        assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 1
        assert await client.queue("slow").group("g").batch(1).wait(False).pop() == []


async def test_client_failed_acks_reach_the_dlq(broker: Broker, options: dict[str, bool]) -> None:
    async with Queen(broker.url, **options) as client:
        await client.queue("flaky").config({"retry_limit": 1}).create()
        await client.queue("flaky").push([{"data": {"n": 7}, "transactionId": "n-7"}])
        seen: list[int] = []

        async def handle(message: Any) -> None:
            seen.append(message["deliveryAttempt"])
            raise RuntimeError("cannot process n-7")

        await client.queue("flaky").group("g").batch(1).limit(2).consume(handle)
        assert seen == [1, 2]
        dlq = await client.queue("flaky").dlq("g").limit(10).get()
        assert dlq["total"] == 1
        (dead,) = dlq["messages"]
        assert dead["transactionId"] == "n-7" and dead["data"] == {"n": 7}
        assert "cannot process n-7" in dead["errorMessage"]
        assert await client.queue("flaky").group("g").batch(1).wait(False).pop() == []


async def test_client_subscription_mode_new(broker: Broker, options: dict[str, bool]) -> None:
    async with Queen(broker.url, **options) as client:
        await client.queue("news").create()
        await client.queue("news").push([{"data": "old"}])
        assert await client.queue("news").group("late").subscription_mode("new").batch(5).wait(False).pop() == []
        await client.queue("news").push([{"data": "fresh"}])
        got = await client.queue("news").group("late").subscription_mode("new").batch(5).wait(False).pop()
        assert [m["data"] for m in got] == ["fresh"]
        everything = await client.queue("news").group("all").batch(5).wait(False).pop()
        assert [m["data"] for m in everything] == ["old", "fresh"]
