"""GET /metrics and GET /metrics/queues: the Prometheus text output parsed by prometheus-client's own
parser, after real pushes, pops and acks over HTTP; per-route counters use templates; message counters
and database gauges on /metrics are per tenant (its size does not grow with the number of queues), the
per-queue and per-group gauges are on /metrics/queues, paged; a scrape with the database gone still
answers."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from queen_pg.jobs.supervisor import Job, JobConfig, Supervisor
from queen_pg.metrics import CONTENT_TYPE, UNMATCHED, Metrics
from tests.conftest import Broker, PgServer, fresh_database
from tests.helpers import ack_batch, eventually, push

Samples = dict[str, list[tuple[dict[str, str], float]]]


async def scrape(http: httpx.AsyncClient, path: str = "/metrics", **params: Any) -> Samples:
    r = await http.get(path, params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPE
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


async def test_push_pop_ack_then_scrape(broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    broker.app.state.metrics.snapshot_max_age = 0.0  # every scrape reads the snapshot table again
    await push(http, "orders", [{"payload": i} for i in range(3)], partition="p1")
    await push(http, "orders", [{"payload": i} for i in range(2)], partition="p2")
    dup = await push(http, "orders", [{"payload": 0, "transactionId": "t-1"}, {"payload": 1, "transactionId": "t-1"}])
    assert [d["status"] for d in dup] == ["queued", "duplicate"]
    await push(http, "other", [{"payload": "x"}])

    r = await http.get("/api/v1/pop/queue/orders/partition/p1", params={"consumerGroup": "billing", "batch": 10})
    popped = r.json()["messages"]
    assert len(popped) == 3
    await ack_batch(http, popped[:2], "billing")
    r = await http.get("/api/v1/pop/queue/orders", params={"batch": 10})  # queue mode
    qm = r.json()["messages"]
    await ack_batch(http, qm[:1], None, status="failed")
    assert (await http.get("/nowhere")).status_code == 404

    m = await scrape(http)
    # messages per tenant, counted from the engine's answers; no per-queue label on /metrics
    assert value(m, "queen_messages_pushed_total", tenant="default") == 7
    assert value(m, "queen_messages_push_duplicates_total", tenant="default") == 1
    assert value(m, "queen_messages_popped_total", tenant="default") == 3 + len(qm)
    assert value(m, "queen_messages_acked_total", tenant="default", status="completed") == 2
    assert value(m, "queen_messages_acked_total", tenant="default", status="failed") == 1
    assert not any("queue" in lab for series in m.values() for lab, _ in series)
    # requests per route template, never the raw path
    assert value(m, "queen_http_requests_total", method="POST", route="/api/v1/push", status="201") == 4
    assert value(m, "queen_http_requests_total", route="/api/v1/pop/queue/{queue}/partition/{partition}") == 1
    assert value(m, "queen_http_requests_total", route="/api/v1/pop/queue/{queue}", status="200") == 1
    assert value(m, "queen_http_requests_total", route="/api/v1/ack/batch", status="200") == 2
    assert value(m, "queen_http_requests_total", route=UNMATCHED, status="404") == 1
    routes = {lab["route"] for lab, _ in m["queen_http_requests_total"]}
    assert not any("orders" in r or "p1" in r for r in routes), routes
    assert value(m, "queen_http_request_duration_seconds_count", method="POST", route="/api/v1/push") == 4
    assert (value(m, "queen_http_request_duration_seconds_sum", method="POST", route="/api/v1/push") or 0) > 0
    # backlog, lag and partitions per queue and group from the database (/metrics/queues), as psql's
    # view tells them
    truth = {
        r["consumer_group"]: r["total_lag"]
        for r in await conn.fetch(
            "SELECT consumer_group, total_lag FROM queen.v_consumer_groups WHERE queue = 'orders'"
        )
    }
    assert truth["billing"] == 1 + 2 + 1  # p1: 1 left, p2: 2, Default: 1
    pq = await scrape(http, "/metrics/queues")
    assert value(pq, "queen_metrics_queues_total") == 2
    assert value(pq, "queen_group_lag_messages", queue="orders", consumer_group="billing") == truth["billing"]
    qm_lag = value(pq, "queen_group_lag_messages", queue="orders", consumer_group="__QUEUE_MODE__")
    assert qm_lag == truth[None] == 6
    assert value(pq, "queen_queue_backlog", queue="orders") == 6
    assert value(pq, "queen_queue_partitions", queue="orders") == 3
    assert value(pq, "queen_queue_messages_written", queue="orders") == 6
    assert value(pq, "queen_queue_dlq_depth", queue="orders") == 0
    assert (value(pq, "queen_group_lag_seconds", queue="orders", consumer_group="billing") or -1) >= 0
    assert value(pq, "queen_group_leased_partitions", queue="orders", consumer_group="billing") == 1  # p1, 1 left
    assert value(pq, "queen_queue_partitions", queue="other") == 1
    # /metrics: the same gauges summed per tenant, from the stats_snapshot job's figures
    assert (await http.post("/api/v1/stats/refresh")).json()["refreshed"] is True
    m = await scrape(http)
    assert value(m, "queen_queues", tenant="default") == 2
    assert value(m, "queen_queue_partitions", tenant="default") == 4
    assert value(m, "queen_queue_messages_written", tenant="default") == 7
    assert value(m, "queen_group_lag_messages", tenant="default") == truth["billing"] + 6
    assert value(m, "queen_queue_backlog", tenant="default") == 6 + 1  # orders' worst group; other: retained
    leased = sum(v for _, v in pq["queen_group_leased_partitions"])
    assert leased >= 1 and value(m, "queen_group_leased_partitions", tenant="default") == leased
    assert (value(m, "queen_group_lag_seconds", tenant="default") or -1) >= 0
    assert (value(m, "queen_stats_snapshot_timestamp_seconds", tenant="default") or 0) > 1.7e9
    assert not any("queue" in lab for series in m.values() for lab, _ in series)
    assert value(m, "queen_db_up") == 1
    # this process: pool, long-poll waiters, limiters (when built), version
    assert value(m, "queen_db_pool_max_connections") == 5
    assert (value(m, "queen_db_pool_connections") or 0) >= 1
    assert value(m, "queen_longpoll_waiters") == 0
    assert value(m, "queen_longpoll_waiters_limit") == 10_000
    assert value(m, "queen_build_info") == 1
    assert value(m, "process_resident_memory_bytes") is not None


async def test_dead_letters_and_parked_waiters_show(broker: Broker, http: httpx.AsyncClient) -> None:
    await http.post("/api/v1/configure", json={"queue": "dl", "options": {"retryLimit": 0}})
    await push(http, "dl", [{"payload": 1}])
    msg = (await http.get("/api/v1/pop/queue/dl", params={"consumerGroup": "g"})).json()["messages"][0]
    await ack_batch(http, [msg], "g", status="dlq")
    parked = asyncio.create_task(http.get("/api/v1/pop/queue/idle", params={"wait": "true", "timeout": 5000}))
    waiters = broker.app.state.queen.waiters
    await eventually(lambda: waiters.parked == 1, "a parked pop")
    pq = await scrape(http, "/metrics/queues")
    assert value(pq, "queen_queue_dlq_depth", queue="dl") == 1
    assert value(pq, "queen_group_dlq_depth", queue="dl", consumer_group="g") == 1
    assert value(pq, "queen_group_lag_messages", queue="dl", consumer_group="g") == 0
    assert value(pq, "queen_group_lag_seconds", queue="dl", consumer_group="g") == 0
    await http.post("/api/v1/stats/refresh")
    broker.app.state.metrics.snapshot_max_age = 0.0
    m = await scrape(http)
    assert value(m, "queen_queue_dlq_depth", tenant="default") == 1
    assert value(m, "queen_group_dlq_depth", tenant="default") == 1
    assert value(m, "queen_messages_acked_total", tenant="default", status="dlq") == 1
    assert value(m, "queen_longpoll_waiters") == 1
    await push(http, "idle", [{"payload": 1}])
    assert (await parked).status_code == 200


async def test_limiters_are_exposed_when_present(broker: Broker, http: httpx.AsyncClient) -> None:
    limiters = getattr(broker.app.state.queen, "limiters", None)
    m = await scrape(http)
    if not limiters:  # no limiter built; absent, nothing is exposed
        assert "queen_limiter" not in m
        return
    for family, limiter in limiters.items():
        for field, v in limiter.snapshot().items():
            assert value(m, "queen_limiter", family=family, field=field) == float(v)


async def test_ack_on_another_broker_counts_for_the_tenant(start_broker: Any, http: httpx.AsyncClient) -> None:
    """An ack names its partition by id only: the broker that did not serve the push or pop counts it for
    the request's tenant at once (no per-queue name to look up, nothing pending until a scrape)."""
    other = await start_broker()
    await push(http, "split", [{"payload": i} for i in range(3)])
    msgs = (await http.get("/api/v1/pop/queue/split", params={"batch": 3})).json()["messages"]
    async with httpx.AsyncClient(base_url=other.url) as b:
        await ack_batch(b, msgs, None)
        m = await scrape(b)
        assert value(m, "queen_messages_acked_total", tenant="default", status="completed") == 3
        assert value(m, "queen_messages_pushed_total", tenant="default") is None  # pushed through the first
        pq = await scrape(b, "/metrics/queues")
        assert value(pq, "queen_group_lag_messages", queue="split", consumer_group="__QUEUE_MODE__") == 0


async def test_metrics_size_does_not_grow_with_queues_and_queues_are_paged(
    broker: Broker, http: httpx.AsyncClient
) -> None:
    broker.app.state.metrics.snapshot_max_age = 0.0
    await push(http, "q-000", [{"payload": 0}])
    await http.post("/api/v1/stats/refresh")
    small = (await http.get("/metrics")).content
    items = [{"queue": f"q-{i:03d}", "payload": i} for i in range(1, 300)]
    r = await http.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    await http.post("/api/v1/stats/refresh")
    text = (await http.get("/metrics")).text
    assert 'queue="' not in text
    # the same series (values differ, and requests made since add a few route samples)
    assert abs(len(text) - len(small)) < 2000, (len(small), len(text))
    m = await scrape(http)
    assert value(m, "queen_queues", tenant="default") == 300

    first = await scrape(http, "/metrics/queues", limit=100)
    assert value(first, "queen_metrics_queues_total") == 300
    names = [lab["queue"] for lab, _ in first["queen_queue_partitions"]]
    assert names == [f"q-{i:03d}" for i in range(100)]
    last = await scrape(http, "/metrics/queues", limit=100, offset=250)
    assert [lab["queue"] for lab, _ in last["queen_queue_partitions"]] == [f"q-{i:03d}" for i in range(250, 300)]
    beyond = await scrape(http, "/metrics/queues", offset=300)
    assert "queen_queue_partitions" not in beyond or beyond["queen_queue_partitions"] == []
    for bad in ({"limit": 0}, {"limit": 10_001}, {"offset": -1}, {"limit": "x"}):
        r = await http.get("/metrics/queues", params=bad)
        assert r.status_code == 400 and "error" in r.json(), (bad, r.text)


async def test_snapshot_is_cached_between_close_scrapes(broker: Broker, http: httpx.AsyncClient) -> None:
    broker.app.state.metrics.snapshot_max_age = 3600.0
    await push(http, "c", [{"payload": 1}])
    await http.post("/api/v1/stats/refresh")
    first = await scrape(http)
    await push(http, "c", [{"payload": 2}])
    await http.post("/api/v1/stats/refresh")
    second = await scrape(http)
    assert value(first, "queen_queue_messages_written", tenant="default") == 1
    assert value(second, "queen_queue_messages_written", tenant="default") == 1  # the same snapshot
    assert value(second, "queen_messages_pushed_total", tenant="default") == 2  # counters are live
    broker.app.state.metrics.snapshot_max_age = 0.0
    third = await scrape(http)
    assert value(third, "queen_queue_messages_written", tenant="default") == 2


async def test_scrape_answers_with_the_database_gone(pg_server: PgServer, start_broker: Any) -> None:
    url = fresh_database(pg_server)
    b = await start_broker(url, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await push(http, "gone", [{"payload": 1}])
        with psycopg.connect(pg_server.admin_url, autocommit=True) as c:
            c.execute(f"DROP DATABASE {urlsplit(url).path.lstrip('/')} WITH (FORCE)")
        m = await scrape(http)
    assert value(m, "queen_db_up") == 0
    assert value(m, "queen_messages_pushed_total", tenant="default") == 1  # the rest is still there
    assert "queen_queue_partitions" not in m  # no snapshot ever succeeded


class Ticker(Job):
    def __init__(self, fail: bool) -> None:
        super().__init__(JobConfig(name="ticker-fail" if fail else "ticker", interval=0.01, limit=10))
        self.fail = fail

    async def run_once(self, db: Any, now: Any = None) -> int:
        if self.fail:
            raise RuntimeError("boom")
        return 3


async def test_job_runs_and_errors_are_counted() -> None:
    sup = Supervisor()
    good, bad = Ticker(False), Ticker(True)
    sup.start_job(good, None)  # type: ignore[arg-type]
    sup.start_job(bad, None)  # type: ignore[arg-type]
    try:
        await eventually(lambda: good.runs >= 2 and bad.errors >= 1, "job ticks")
    finally:
        await sup.stop()
    metrics = Metrics(multiprocess_dir="")
    metrics.sample(None, None, None, sup)
    m: Samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            m.setdefault(s.name, []).append((s.labels, s.value))
    assert value(m, "queen_job_runs_total", job="ticker") == good.runs
    assert value(m, "queen_job_items_total", job="ticker") == 3 * good.runs
    assert value(m, "queen_job_errors_total", job="ticker-fail") == bad.errors
    assert value(m, "queen_job_errors_total", job="ticker") is None
    metrics.sample(None, None, None, sup)  # sampled again: counters do not double
    again = text_string_to_metric_families(metrics.render().decode())
    runs = next(f for f in again if f.name == "queen_job_runs")
    assert [s.value for s in runs.samples if s.labels.get("job") == "ticker"] == [good.runs]
