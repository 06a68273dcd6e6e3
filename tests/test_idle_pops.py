"""Idle consumers cost almost nothing: parked pops share one backed-off database re-check per queue
and group, pops woken together claim one after the other (the first that finds the queue empty
again spares the others their claim), and a lease this process handed out wakes the pops parked on
its queue when it expires, without the lease-expiry job and without a re-check."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from queen_pg.engine.waiters import Waiters
from tests.conftest import Broker
from tests.helpers import eventually, push


def _waiters(b: Broker) -> Waiters:
    w: Waiters = b.app.state.queen.waiters
    return w


async def _pops(http: httpx.AsyncClient, queue: str, n: int, timeout_ms: int, **extra: Any) -> list[asyncio.Task[Any]]:
    params = {"wait": "true", "timeout": timeout_ms, **extra}
    return [asyncio.create_task(http.get(f"/api/v1/pop/queue/{queue}", params=params)) for _ in range(n)]


async def test_parked_pops_share_one_backed_off_recheck(start_broker: Any) -> None:
    b: Broker = await start_broker(pop_poll_interval_ms=50, pop_poll_max_ms=200, jobs_enabled=False)
    w = _waiters(b)
    async with httpx.AsyncClient(base_url=b.url, timeout=30, limits=httpx.Limits(max_connections=20)) as http:
        assert (await http.post("/api/v1/configure", json={"queue": "idle"})).status_code == 200
        tasks = await _pops(http, "idle", 10, 3000)
        answers = await asyncio.gather(*tasks)
    assert [a.status_code for a in answers] == [204] * 10
    # 10 pops x 3 s at one re-check per 50 ms each would be ~600; shared and backed off to 200 ms: ~16
    assert 1 <= w.probes <= 25, w.probes
    async with httpx.AsyncClient(base_url=b.url) as http:
        text = (await http.get("/metrics")).text
    assert f"queen_longpoll_probes_total {float(w.probes)}" in text
    assert "queen_longpoll_claims_skipped_total" in text


async def test_only_one_parked_pop_wakes_for_the_shared_recheck(start_broker: Any) -> None:
    """The group's watcher alone has a timer at the re-check; the other parked pops sleep through it
    (a wake they skip would count in ``skipped``: with every pop woken at each re-check it would be
    about (pops - 1) per probe)."""
    b: Broker = await start_broker(pop_poll_interval_ms=50, pop_poll_max_ms=100, jobs_enabled=False)
    w = _waiters(b)
    async with httpx.AsyncClient(base_url=b.url, timeout=30, limits=httpx.Limits(max_connections=20)) as http:
        assert (await http.post("/api/v1/configure", json={"queue": "quiet"})).status_code == 200
        tasks = await _pops(http, "quiet", 10, 3000)
        await eventually(lambda: w.parked == 10, "10 pops parked")
        probes, skipped = w.probes, w.skipped
        await eventually(lambda: w.probes >= probes + 10, "ten shared re-checks")
        assert w.skipped - skipped <= 2 + (w.probes - probes) // 2, (w.skipped - skipped, w.probes - probes)
        answers = await asyncio.gather(*tasks)
    assert [a.status_code for a in answers] == [204] * 10


def test_a_leaving_watcher_hands_the_recheck_on() -> None:
    import random

    from queen_pg.engine.probes import Probe

    p = Probe(1.0, 4.0, random.Random(1))
    a, b, c = asyncio.Event(), asyncio.Event(), asyncio.Event()
    for m in (a, b, c):
        p.join(m)
    p.end(0, found=False, probing=False, now=0.0)
    assert p.park_for(0.0, a) <= 1.2  # the first to park watches
    assert p.park_for(0.0, b) == p.park_for(0.0, c) == float("inf")
    p.leave(c)
    assert not b.is_set()  # a non-watcher leaving wakes nobody
    p.leave(a)
    assert b.is_set() and p.park_for(0.0, b) <= 1.2  # the next member takes the role
    assert p.begin(5.0, b) == "probe" and p.watcher is b


async def test_pops_woken_together_claim_one_after_the_other(start_broker: Any) -> None:
    b: Broker = await start_broker(pop_poll_interval_ms=60_000, jobs_enabled=False)
    w = _waiters(b)
    async with httpx.AsyncClient(base_url=b.url, timeout=30, limits=httpx.Limits(max_connections=20)) as http:
        assert (await http.post("/api/v1/configure", json={"queue": "herd"})).status_code == 200
        tasks = await _pops(http, "herd", 10, 4000)
        await eventually(lambda: w.parked == 10, "10 pops parked")
        skipped = w.skipped
        await push(http, "herd", [{"payload": 1}])
        await eventually(lambda: sum(t.done() for t in tasks) == 1, "one pop answered")
        await eventually(lambda: w.parked == 9, "the other nine parked again")
        # the first claim took the message, the second found the queue empty, eight never asked (one
        # more skip when the pop that answered was the group's watcher: it woke another to take over)
        assert w.skipped - skipped in (8, 9)
        answers = await asyncio.gather(*tasks)
    assert sorted(a.status_code for a in answers) == [200] + [204] * 9


async def test_an_expiring_lease_wakes_the_pops_parked_on_its_queue(start_broker: Any) -> None:
    b: Broker = await start_broker(pop_poll_interval_ms=60_000, jobs_enabled=False)  # no job, no re-check
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        r = await http.post("/api/v1/configure", json={"queue": "lease", "options": {"leaseTime": 1}})
        assert r.status_code == 200
        await push(http, "lease", [{"payload": "x"}])
        first = await http.get("/api/v1/pop/queue/lease")  # leased for 1 s and never acked
        assert first.status_code == 200
        again = await http.get("/api/v1/pop/queue/lease", params={"wait": "true", "timeout": 10_000})
    assert again.status_code == 200
    m = again.json()["messages"][0]
    assert m["data"] == "x" and m["deliveryAttempt"] == 2


def test_probe_state_machine() -> None:
    """One member probes when due, empty probes double the delay up to the cap, a wake (epoch bump)
    or a find starts over; a claim overtaken by a wake records nothing."""
    import random

    from queen_pg.engine.probes import Probe

    p = Probe(1.0, 4.0, random.Random(1))
    assert p.begin(0.0) == "claim"  # never looked
    p.end(0, found=False, probing=False, now=0.0)
    assert p.known_empty() and 0.8 <= p.due <= 1.2
    assert p.begin(0.5) is None  # known empty, not due: park without the database
    assert p.begin(2.0) == "probe" and p.begin(2.0) is None  # one prober at a time
    p.end(0, found=False, probing=True, now=2.0)
    assert p.delay == 2.0
    for t in (10.0, 20.0, 30.0):
        assert p.begin(t) == "probe"
        p.end(0, found=False, probing=True, now=t)
    assert p.delay == 4.0  # capped
    p.epoch += 1  # a wake
    assert not p.known_empty() and p.begin(31.0) == "claim"
    token = p.epoch
    p.epoch += 1  # another wake while that claim runs
    p.end(token, found=False, probing=False, now=31.0)
    assert not p.known_empty()  # stale verdict ignored
    p.end(p.epoch, found=False, probing=False, now=31.0)
    assert p.known_empty() and p.delay == 1.0  # new epoch: backoff starts over
    assert p.begin(40.0) == "probe"
    p.end(p.epoch, found=True, probing=True, now=40.0)
    assert not p.known_empty() and p.delay == 1.0
