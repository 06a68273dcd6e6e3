"""The Vegas limiter (queen_pg/limiter.py): pure-Python tests with a fake clock, then over HTTP: a tiny,
busy limiter makes requests wait their turn (not fail) within the hold, refuses with 429 past it, and a
parked long-poll holds no permit."""

from __future__ import annotations

import asyncio
import logging
import random
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from queen_pg.errors import DB_UNAVAILABLE, QueenError, Verdict
from queen_pg.limiter import FairSemaphore, Limiter, LimiterConfig, QueueFull
from tests.helpers import eventually, push

MS = 0.001

RETRY_AFTER = set(range(1, 6))  # seconds a 429 may ask a client to wait (1-5)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def full_round(lim: Limiter, clock: FakeClock, rtt: float) -> None:
    """Fill the limiter to its limit, let every call take ``rtt``, release them all."""
    async with AsyncExitStack() as stack:
        for _ in range(lim.limit):
            await stack.enter_async_context(lim.acquire())
        clock.t += rtt


def limiter(clock: FakeClock, **cfg: Any) -> Limiter:
    config = LimiterConfig(**{"initial": 20, "min_limit": 2, "max_limit": 200, **cfg})
    return Limiter("push", config, clock=clock, rng=random.Random(7))


async def test_limit_shrinks_when_rtt_rises_and_grows_back_when_it_falls() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    for _ in range(5):
        await full_round(lim, clock, 1 * MS)  # unloaded: no queue, the limit is used, so it grows
    grown = lim.limit
    assert grown > 20
    assert lim.rtt_min == pytest.approx(1 * MS)
    for _ in range(10):
        await full_round(lim, clock, 10 * MS)  # the database slows down tenfold: queueing
    shrunk = lim.limit
    assert shrunk < 20 < grown
    assert lim.rtt == pytest.approx(10 * MS, rel=0.05)
    assert lim.rtt_min == pytest.approx(1 * MS)  # still within its window
    for _ in range(10):
        await full_round(lim, clock, 1 * MS)  # and recovers
    assert lim.limit > 20 > shrunk
    snap = lim.snapshot()
    assert snap["limit"] == lim.limit
    assert snap["in_flight"] == 0 and snap["queued"] == 0
    assert snap["rtt_min_seconds"] == pytest.approx(1 * MS)


def test_limit_is_clamped_and_does_not_grow_when_idle() -> None:
    clock = FakeClock()
    lim = limiter(clock, initial=10, min_limit=8, max_limit=12)
    for _ in range(50):
        lim.observe(1 * MS, in_flight=1)  # fast, but only 1 of 10 permits used: no reason to grow
    assert lim.limit == 10
    for _ in range(50):
        lim.observe(1 * MS, in_flight=lim.limit)
    assert lim.limit == 12  # max
    for _ in range(200):
        lim.observe(50 * MS, in_flight=lim.limit)
    assert lim.limit == 8  # min (unclamped, Vegas would settle near 6 here: queue 6 x 0.98 < beta 6)
    lim.observe(0.0)  # nonsense samples are ignored
    lim.observe(-1.0)
    assert lim.limit == 8


def test_rtt_min_is_windowed() -> None:
    clock = FakeClock()
    lim = limiter(clock, rtt_min_window_s=10.0)
    lim.observe(1 * MS)
    clock.t += 11
    lim.observe(5 * MS)  # a new window: the old minimum is still remembered for one more window
    assert lim.rtt_min == pytest.approx(1 * MS)
    clock.t += 11
    lim.observe(5 * MS)  # two windows later the baseline has moved
    assert lim.rtt_min == pytest.approx(5 * MS)


async def test_5xx_and_cancellation_are_not_samples_but_verdicts_are() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    with pytest.raises(QueenError):
        async with lim.acquire():
            clock.t += 5
            raise QueenError(DB_UNAVAILABLE, detail="down")
    assert lim.rtt == 0 and lim.in_flight == 0
    with pytest.raises(Verdict):
        async with lim.acquire():
            clock.t += 2 * MS
            raise Verdict("duplicate", {})
    assert lim.rtt == pytest.approx(2 * MS)
    assert lim.in_flight == 0


async def test_fair_semaphore_is_first_come_first_served_and_bounded() -> None:
    sem = FairSemaphore(capacity=10, max_waiters=2)
    assert sem.try_acquire(8)
    order: list[str] = []

    async def take(name: str, weight: int) -> None:
        await sem.acquire(weight, 5)
        order.append(name)

    big = asyncio.create_task(take("big", 6))
    await eventually(lambda: sem.queued == 1, "the big request to queue")
    small = asyncio.create_task(take("small", 1))  # would fit now, but must not overtake
    await eventually(lambda: sem.queued == 2, "the small request to queue")
    assert sem.used == 8 and not sem.try_acquire(1)
    with pytest.raises(QueueFull):
        await sem.acquire(1, 5)
    sem.release(8)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and sem.used == 7
    with pytest.raises(TimeoutError):
        await sem.acquire(5, 0.01)  # the wait we asked for runs out
    assert sem.queued == 0 and sem.used == 7
    sem.release(7)
    assert sem.try_acquire(50) and sem.used == 50  # heavier than capacity: granted when alone
    sem.release(50)


async def test_a_cancelled_waiter_hands_its_turn_on() -> None:
    sem = FairSemaphore(capacity=1, max_waiters=10)
    assert sem.try_acquire(1)
    first = asyncio.create_task(sem.acquire(1, 5))
    second = asyncio.create_task(sem.acquire(1, 5))
    await eventually(lambda: sem.queued == 2, "two waiters")
    first.cancel()
    sem.release(1)
    await second
    assert first.cancelled() and sem.used == 1 and sem.queued == 0


async def test_refusal_is_429_with_retry_after_and_logged_once_per_transition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    lim = limiter(clock, initial=1, min_limit=1, max_limit=1, max_wait_s=0.02, max_queue=1)
    caplog.set_level(logging.INFO, logger="queen_pg.limiter")
    async with lim.acquire():
        refusals = []
        for _ in range(3):
            with pytest.raises(QueenError) as err:
                async with lim.acquire():
                    pass
            refusals.append(err.value)
    assert {(e.status, e.code) for e in refusals} == {(429, "overloaded")}
    assert {int((e.headers() or {})["Retry-After"]) for e in refusals} <= RETRY_AFTER
    async with lim.acquire():  # gets in at once again
        pass
    lines = [r.getMessage() for r in caplog.records]
    assert sum("event=overloaded family=push" in m for m in lines) == 1, lines
    assert sum("event=overload_cleared family=push" in m and "refused=3" in m for m in lines) == 1, lines
    assert lim.snapshot()["rejected_total"] == 3


# ---- over HTTP -------------------------------------------------------------------------------------


async def test_a_tiny_busy_limiter_makes_pushes_wait_their_turn(start_broker: Any) -> None:
    b = await start_broker(limiter_min=1, limiter_max=1, limiter_initial=1, fuse_hold_us=0)  # unfused: a permit each
    lim: Limiter = b.app.state.queen.limiters["push"]
    assert set(b.app.state.queen.limiters) == {"push", "pop", "ack", "transaction", "kv"}
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        async with lim.acquire():  # the one permit is busy
            pushes = [asyncio.create_task(push(http, "busy", [{"payload": i}])) for i in range(3)]
            await eventually(lambda: lim.queued == 3, "three pushes to wait for the permit")
            assert not any(t.done() for t in pushes)
        results = await asyncio.gather(*pushes)  # push() asserts 201
    assert sorted(r[0]["offset"] for r in results) == [0, 1, 2]
    assert lim.limit == 1 and lim.in_flight == 0 and lim.queued == 0


async def test_fused_pushes_wait_for_one_permit_per_call_not_one_each(start_broker: Any) -> None:
    """With fusion on, the limiter gates procedure calls: requests waiting in one batch wait for ONE
    permit (a permit per request sized the limit by the batch wait and capped the batches)."""
    b = await start_broker(limiter_min=1, limiter_max=1, limiter_initial=1, fuse_hold_us=1_000_000, jobs_enabled=False)
    lim: Limiter = b.app.state.queen.limiters["push"]
    lane = b.app.state.queen.fuser.push_lane("default")
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        async with lim.acquire():  # the one permit is busy
            first = asyncio.create_task(push(http, "busy", [{"payload": 0}]))
            await eventually(lambda: lim.queued == 1 and lane.running == 1, "the first push's call to wait")
            rest = [asyncio.create_task(push(http, "busy", [{"payload": i}])) for i in range(1, 6)]
            await eventually(lambda: lane.queued == 5, "five pushes to gather behind it")
            assert lim.queued == 1 and lim.in_flight == 1  # still only the first call waits for a permit
        results = await asyncio.gather(first, *rest)  # push() asserts 201
    assert sorted(r[0]["offset"] for r in results) == list(range(6))
    assert lane.stats.calls == 2 and lane.stats.requests == 6  # the first alone, then the five in one call
    assert lim.in_flight == 0 and lim.queued == 0


async def test_a_fused_batch_refused_by_the_limiter_is_429_for_every_member_and_wrote_nothing(
    start_broker: Any,
) -> None:
    b = await start_broker(
        limiter_min=1, limiter_max=1, limiter_initial=1, admit_hold_ms=300, fuse_hold_us=1_000, jobs_enabled=False
    )
    queen = b.app.state.queen
    lane = queen.fuser.push_lane("default")
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        async with queen.limiters["push"].acquire():
            answers = await asyncio.gather(
                *(http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": i}]}) for i in range(6))
            )
            assert [a.status_code for a in answers] == [429] * 6, [a.text for a in answers]
            assert all(a.json()["code"] == "overloaded" for a in answers)
            assert all(int(a.headers["Retry-After"]) in RETRY_AFTER for a in answers)
        assert lane.stats.isolated == 0  # a refused call is not retried member by member
        assert lane.stats.calls < lane.stats.requests == 6  # they were fused
        res = await push(http, "q", [{"payload": "after"}])
    assert res[0]["status"] == "queued" and res[0]["offset"] == 0
    assert await queen.db.fetchval("SELECT count(*) FROM queen.log_txns") == 1  # the 429s wrote nothing


async def test_fused_acks_hold_ack_permits_per_call(start_broker: Any) -> None:
    b = await start_broker(limiter_min=1, limiter_max=1, limiter_initial=1, admit_hold_ms=300, jobs_enabled=False)
    queen = b.app.state.queen
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await push(http, "q", [{"payload": 1}])
        r = await http.get("/api/v1/pop/queue/q")
        m = r.json()["messages"][0]
        ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
        async with queen.limiters["ack"].acquire():
            refused = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ack]})
            assert refused.status_code == 429 and refused.json()["code"] == "overloaded", refused.text
        ok = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ack]})
        assert ok.status_code == 200 and ok.json()[0]["success"] is True, ok.text
    assert queen.fuser.ack_lane("default").stats.requests == 2
    assert queen.limiters["ack"].in_flight == 0


async def test_a_push_refused_past_the_hold_gets_429_with_retry_after(start_broker: Any) -> None:
    b = await start_broker(limiter_min=1, limiter_max=1, limiter_initial=1, admit_hold_ms=100)
    queen = b.app.state.queen
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        async with queen.limiters["push"].acquire():
            r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]})
            assert r.status_code == 429, r.text
            assert r.json()["code"] == "overloaded"
            assert int(r.headers["Retry-After"]) in RETRY_AFTER
            # other families have their own permits
            ok = await http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}]})
            assert ok.status_code == 200, ok.text
        async with queen.limiters["kv"].acquire():
            r = await http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}]})
            assert r.status_code == 429 and r.json()["code"] == "overloaded"
            assert int(r.headers["Retry-After"]) in RETRY_AFTER
        res = await push(http, "q", [{"payload": 1}])
    assert res[0]["status"] == "queued"
    assert await b.app.state.queen.db.fetchval("SELECT count(*) FROM queen.log_txns") == 1  # the 429 wrote nothing


async def test_parked_long_polls_hold_no_pop_permit(start_broker: Any) -> None:
    b = await start_broker(limiter_min=1, limiter_max=1, limiter_initial=1, pop_poll_interval_ms=60_000)
    queen = b.app.state.queen
    lim: Limiter = queen.limiters["pop"]
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        parked = [
            asyncio.create_task(
                http.get("/api/v1/pop/queue/idle", params={"wait": "true", "timeout": 30_000, "consumerGroup": f"g{i}"})
            )
            for i in range(3)
        ]
        await eventually(lambda: queen.waiters.parked == 3, "three pops to park")
        assert lim.in_flight == 0  # parked: no permit held
        await push(http, "busy", [{"payload": "x"}])
        r = await http.get("/api/v1/pop/queue/busy", params={"consumerGroup": "g"})
        assert r.status_code == 200, r.text  # claimed through the one permit while three pops are parked
        assert [m["data"] for m in r.json()["messages"]] == ["x"]
        assert queen.waiters.parked == 3 and not any(t.done() for t in parked)
        await push(http, "idle", [{"payload": "wake"}])  # wakes them: each takes the permit again to claim
        answers = await asyncio.gather(*parked)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(a.json()["messages"][0]["data"] == "wake" for a in answers)  # one per group
    assert lim.in_flight == 0
