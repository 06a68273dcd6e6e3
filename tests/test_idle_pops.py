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
    d, e = asyncio.Event(), asyncio.Event()
    p.join(d)
    p.join(e)
    p.leave(b)  # the watcher leaves: d is woken to take over...
    assert d.is_set() and not e.is_set()
    p.leave(d)  # ...but leaves before it parks: the role is still vacant, so e is woken
    assert e.is_set() and p.park_for(6.0, e) < float("inf")


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


async def _configure(http: httpx.AsyncClient, queue: str, **options: Any) -> None:
    r = await http.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


async def test_a_delayed_message_wakes_the_parked_pop_when_it_becomes_visible(start_broker: Any) -> None:
    """The re-check is a minute away and no job runs: a 200 within the pop's 10 s can only come from
    the wake scheduled for the moment the delayed message becomes visible."""
    b: Broker = await start_broker(pop_poll_interval_ms=60_000, pop_poll_max_ms=60_000, jobs_enabled=False)
    w = _waiters(b)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await _configure(http, "later", delayedProcessing=1)
        (parked,) = await _pops(http, "later", 1, 10_000, autoAck="true")
        await eventually(lambda: w.parked == 1, "the pop parked")
        await push(http, "later", [{"payload": "soon"}])
        answer = await parked
        # pushed first, popped after: the pop's own empty look schedules the wake
        await push(http, "later", [{"payload": "second"}])
        again = await http.get("/api/v1/pop/queue/later", params={"wait": "true", "timeout": 10_000, "autoAck": "true"})
        metrics = (await http.get("/metrics")).text
    assert f"queen_longpoll_visibility_lookups_total {float(w.lookups)}" in metrics and w.lookups >= 2
    assert "queen_longpoll_scheduled_wakes " in metrics and "queen_longpoll_waiters " in metrics
    assert answer.status_code == 200 and answer.json()["messages"][0]["data"] == "soon"
    assert again.status_code == 200 and again.json()["messages"][0]["data"] == "second"


async def test_a_window_buffer_wakes_the_parked_pop_when_the_partition_goes_quiet(start_broker: Any) -> None:
    b: Broker = await start_broker(pop_poll_interval_ms=60_000, pop_poll_max_ms=60_000, jobs_enabled=False)
    w = _waiters(b)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await _configure(http, "quiet", windowBuffer=1)
        (parked,) = await _pops(http, "quiet", 1, 10_000)
        await eventually(lambda: w.parked == 1, "the pop parked")
        await push(http, "quiet", [{"payload": 1}, {"payload": 2}])
        answer = await parked
    assert answer.status_code == 200
    assert [m["data"] for m in answer.json()["messages"]] == [1]  # batch 1: the first, after the quiet second


async def test_the_scheduled_wake_never_delivers_a_message_before_it_is_visible(start_broker: Any) -> None:
    b: Broker = await start_broker(pop_poll_interval_ms=60_000, pop_poll_max_ms=60_000, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await _configure(http, "far", delayedProcessing=30)
        await push(http, "far", [{"payload": "x"}])
        early = await http.get("/api/v1/pop/queue/far", params={"wait": "true", "timeout": 1_500})
        r = await http.get("/api/v1/resources/queues/far")
    assert early.status_code == 204  # the wake is 30 s away; nothing is visible before
    assert r.status_code == 200


def test_next_at_marks_the_first_empty_look_of_an_epoch() -> None:
    import random

    from queen_pg.engine.probes import Probe

    p = Probe(1.0, 4.0, random.Random(1))
    assert p.end(0, found=False, probing=False, now=0.0) is True  # ask when the queue's messages show
    assert p.end(0, found=False, probing=False, now=0.1) is False  # the others woken with it: no
    assert p.end(0, found=False, probing=True, now=2.0) is False  # the re-check: no
    p.epoch += 1  # a push woke the queue
    assert p.end(1, found=False, probing=False, now=3.0) is True
    assert p.end(1, found=True, probing=False, now=3.0) is False


async def test_a_lease_taken_elsewhere_wakes_the_parked_pop_when_it_expires(start_broker: Any) -> None:
    """A lease this process did not hand out (another replica's: here a claim made without this
    process's waiters) is found by the parked pop's empty look, which schedules its wake."""
    from queen_pg.engine import pop as pop_engine

    b: Broker = await start_broker(pop_poll_interval_ms=60_000, pop_poll_max_ms=60_000, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        await _configure(http, "elsewhere", leaseTime=1)
        await push(http, "elsewhere", [{"payload": "x"}])
        req = pop_engine.PopRequest("elsewhere", None, None, None, None, 1, 1, False, 0, False, None, None, False)
        taken = await pop_engine.claim(b.app.state.queen.db, b.settings.default_tenant, req)  # no waiters
        assert taken is not None and taken.messages == 1  # a RenderedPop: the rendered answer and its count
        again = await http.get("/api/v1/pop/queue/elsewhere", params={"wait": "true", "timeout": 10_000})
    assert again.status_code == 200
    assert again.json()["messages"][0]["deliveryAttempt"] == 2
