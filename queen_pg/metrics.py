"""Prometheus metrics of one broker app: what ``GET /metrics`` exposes.

Three kinds of numbers, three ways to get them:

* **Counted on the request path** (HTTP requests and latency per route template, messages pushed,
  popped and acked per tenant): plain prometheus-client counters and histograms; the label children
  are cached so a hot-path update is a dict lookup and an increment.
* **Sampled in this process** (pool connections, parked long-polls, limiter limits, background-job
  runs): :meth:`Metrics.sample` reads them just before a scrape.
* **Read from PostgreSQL** (queues, partitions, backlog, lag, DLQ depth, summed per tenant): ONE call
  to ``queen.metrics_tenants_v1`` per scrape (one row per tenant, kept by the stats_snapshot job, so the
  scrape costs the same at 100,000 queues), reused for ``snapshot_max_age`` seconds
  (:class:`SnapshotCollector`).

``GET /metrics`` carries no per-queue series, so its size does not grow with the number of queues (as
RabbitMQ's ``/metrics``); the same gauge names with ``queue`` and ``consumer_group`` labels are on
``GET /metrics/queues``, one page of queues per call (:func:`render_queues`).

Every app has its own :class:`~prometheus_client.CollectorRegistry` (tests build many apps in one
process). With several uvicorn workers (``queen-pg serve --workers N``) the CLI sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start: counters and histograms then live in files
there and a scrape, whichever worker answers it, sums every worker's (prometheus-client's
multiprocess mode); per-process gauges are summed over live workers (limiter gauges keep a ``pid``
label), and each worker samples them every second. The database snapshot is global by nature.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics import disable_created_metrics

from queen_pg import __version__
from queen_pg.db.pool import Database
from queen_pg.engine import ack as ack_engine
from queen_pg.engine import metrics as metrics_engine
from queen_pg.engine import pop_render
from queen_pg.errors import QueenError

log = logging.getLogger("queen_pg.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
UNMATCHED = "<unmatched>"  # the route label of a request no route matched (404s): bounded cardinality
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SAMPLE_INTERVAL_S = 1.0  # per-worker sampling with several workers


Q_LABELS = ["tenant", "queue"]
G_LABELS = ["tenant", "queue", "consumer_group"]

# (gauge name, help, the row field it shows): one gauge a line, built and filled by one loop each
Gauges = tuple[tuple[str, str, str], ...]
TENANT_GAUGES: Gauges = (
    ("queen_queues", "Queues of the tenant", "queues"),
    ("queen_queue_partitions", "Partitions, summed over the tenant's queues", "partitions"),
    (
        "queen_queue_messages_written",
        "Messages ever written (sum of next offsets) over the tenant's queues",
        "messages",
    ),
    (
        "queen_queue_backlog",
        "Sum over the tenant's queues of the messages their most lagging group has not done",
        "backlog",
    ),
    ("queen_queue_in_flight", "Messages under a live lease not yet acked", "in_flight"),
    ("queen_queue_dlq_depth", "Dead letters of the tenant's queues", "dlq"),
    ("queen_group_lag_messages", "Messages not yet done, summed over every group", "group_lag"),
    ("queen_group_lag_seconds", "Age of the oldest message any group of the tenant has not done", "lag_seconds"),
    ("queen_group_leased_partitions", "Partitions under a live lease, over every group", "leased_partitions"),
    ("queen_group_dlq_depth", "Dead letters, over every group", "dlq"),
    (
        "queen_stats_snapshot_timestamp_seconds",
        "When these per-tenant figures were computed (stats_snapshot job), Unix time",
        "as_of",
    ),
)
QUEUE_GAUGES: Gauges = (
    ("queen_queue_partitions", "Partitions of the queue", "partitions"),
    ("queen_queue_messages_written", "Messages ever written to the queue (sum of next offsets)", "messages"),
    ("queen_queue_backlog", "Messages not yet done by the queue's most lagging consumer group", "backlog"),
    ("queen_queue_dlq_depth", "Dead letters of the queue", "dlq"),
)
GROUP_GAUGES: Gauges = (
    ("queen_group_lag_messages", "Messages not yet done by the group", "lag"),
    ("queen_group_lag_seconds", "Age of the oldest message not yet done by the group", "lag_seconds"),
    ("queen_group_leased_partitions", "Partitions the group holds a live lease on", "leased_partitions"),
    ("queen_group_dlq_depth", "Dead letters of the group", "dlq"),
)


def _families(gauges: Gauges, labels: list[str]) -> list[tuple[GaugeMetricFamily, str]]:
    return [(GaugeMetricFamily(name, doc, labels=labels), field) for name, doc, field in gauges]


def _fill(fams: list[tuple[GaugeMetricFamily, str]], key: list[str], row: object, **computed: float) -> None:
    """One sample per family from ``row``'s field (or from ``computed``, for what the row does not carry)."""
    for fam, field in fams:
        fam.add_metric(key, computed[field] if field in computed else float(getattr(row, field)))


class SnapshotCollector:
    """The gauges read from the database, summed per tenant: rendered from the last snapshot."""

    def __init__(self) -> None:
        self.snapshot: list[metrics_engine.TenantRow] | None = None
        self.db_up = False
        self.seconds = 0.0  # how long the last snapshot query took

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("queen_db_up", "1 when the last metrics snapshot query succeeded")
        up.add_metric([], 1.0 if self.db_up else 0.0)
        yield up
        took = GaugeMetricFamily("queen_metrics_snapshot_seconds", "Duration of the last metrics snapshot query")
        took.add_metric([], self.seconds)
        yield took
        if self.snapshot is None:
            return
        fams = _families(TENANT_GAUGES, ["tenant"])
        for row in self.snapshot:
            _fill(fams, [row.tenant], row, as_of=row.as_of.timestamp())
        for fam, _ in fams:
            yield fam


class QueuePageCollector:
    """The per-queue and per-group gauges of one page of queues (``GET /metrics/queues``)."""

    def __init__(self, snap: metrics_engine.Snapshot, total: int) -> None:
        self.snap = snap
        self.total = total

    def collect(self) -> Iterator[Metric]:
        snap = self.snap
        total = GaugeMetricFamily("queen_metrics_queues_total", "Queues in all pages of /metrics/queues")
        total.add_metric([], self.total)
        yield total
        queues = _families(QUEUE_GAUGES, Q_LABELS)
        groups = _families(GROUP_GAUGES, G_LABELS)
        worst: dict[tuple[str, str], int] = {}
        for g in snap.groups:
            _fill(groups, [g.tenant, g.queue, g.group], g)
            worst[(g.tenant, g.queue)] = max(worst.get((g.tenant, g.queue), 0), g.lag)
        for q in snap.queues:
            _fill(queues, [q.tenant, q.queue], q, backlog=worst.get((q.tenant, q.queue), 0))
        for fam, _ in queues + groups:
            yield fam


def render_queues(snap: metrics_engine.Snapshot, total: int) -> bytes:
    """The exposition of one page of ``GET /metrics/queues``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(QueuePageCollector(snap, total))
    return generate_latest(reg)


class Metrics:
    """The metrics of one app. Created by ``create_app``; reached as ``app.state.metrics``."""

    def __init__(self, multiprocess_dir: str | None = None, snapshot_max_age: float = 1.0) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series per counter
        self.multiprocess_dir = multiprocess_dir if multiprocess_dir is not None else os.environ.get(MULTIPROC_ENV)
        self.snapshot_max_age = snapshot_max_age
        reg = self.registry = CollectorRegistry()
        self.requests = Counter(
            "queen_http_requests",
            "HTTP requests answered, by route template",
            ["method", "route", "status"],
            registry=reg,
        )
        self.latency = Histogram(
            "queen_http_request_duration_seconds",
            "HTTP request latency by route template (long-poll pops include their wait)",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        t = ["tenant"]  # per queue: GET /metrics/queues (gauges from the database), never here
        self.pushed = Counter("queen_messages_pushed", "Messages appended by POST /push", t, registry=reg)
        self.duplicates = Counter(
            "queen_messages_push_duplicates",
            "Pushed items refused as duplicates of a stored transactionId",
            t,
            registry=reg,
        )
        self.popped = Counter("queen_messages_popped", "Messages delivered by pops", t, registry=reg)
        self.pop_cache_bytes = Gauge(
            "queen_pop_cache_bytes",
            "Decoded segments held for pops (estimated bytes; QUEEN_POP_CACHE_MB)",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.pop_cache = Counter(
            "queen_pop_cache_lookups", "Pop segment-cache lookups by result (hit, miss, eviction)", ["result"],
            registry=reg,
        )  # fmt: skip
        self.acked = Counter(
            "queen_messages_acked", "Messages settled by acks, by status", [*t, "status"], registry=reg
        )
        self.pool_size = Gauge(
            "queen_db_pool_connections", "Open connections of the pool", registry=reg, multiprocess_mode="livesum"
        )
        self.pool_idle = Gauge(
            "queen_db_pool_idle_connections", "Idle connections of the pool", registry=reg, multiprocess_mode="livesum"
        )
        self.pool_max = Gauge(
            "queen_db_pool_max_connections", "Largest size of the pool", registry=reg, multiprocess_mode="livesum"
        )
        self.waiters = Gauge(
            "queen_longpoll_waiters", "Long-poll pops parked right now", registry=reg, multiprocess_mode="livesum"
        )
        self.waiters_limit = Gauge(
            "queen_longpoll_waiters_limit",
            "Most long-poll pops that may park",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.probes = Counter(
            "queen_longpoll_probes",
            "Database re-checks made for parked long-poll pops (one per queue/group/partition, backed off)",
            registry=reg,
        )
        self.skipped = Counter(
            "queen_longpoll_claims_skipped",
            "Pop claims skipped because the queue was known empty (no wake since the last empty look)",
            registry=reg,
        )
        self.scheduled_wakes = Gauge(
            "queen_longpoll_scheduled_wakes",
            "Wakes scheduled for the moment a lease expires or held-back messages become visible",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.lookups = Counter(
            "queen_longpoll_visibility_lookups",
            "Database look-ups of when a queue's held-back messages become visible (one per wake that found "
            "the queue empty)",
            registry=reg,
        )
        self.mesh_peers = Gauge(
            "queen_mesh_peers_connected",
            "Mesh peers this process is connected to",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.mesh_outbox = Gauge(
            "queen_mesh_outbox_frames", "Mesh frames queued for peers", registry=reg, multiprocess_mode="livesum"
        )
        self.mesh_frames = Counter(
            "queen_mesh_frames", "Mesh frames by direction (sent, received, relayed)", ["direction"], registry=reg
        )
        self.mesh_dropped = Counter(
            "queen_mesh_frames_dropped",
            "Mesh frames dropped: direction send (peer_down, queue_full) or recv (bad_mac, stale, oversize, "
            "truncated, malformed, version, no_hello, replayed, bad_hello; connections closed: pending_evicted, "
            "too_many_connections, replaced, idle)",
            ["direction", "reason"],
            registry=reg,
        )
        self.mesh_wakes = Counter(
            "queen_mesh_wakes",
            "Wakes between sibling workers by outcome: filtered (not sent: no pop of the sibling waited on "
            "the queue) or caught_up (sent in answer to a sibling's new interest)",
            ["outcome"],
            registry=reg,
        )
        self.limiter = Gauge(
            "queen_limiter",
            "Concurrency limiter state per route family (field: limit, inflight, queued, rtt, ...)",
            ["family", "field"],
            registry=reg,
            multiprocess_mode="liveall",
        )
        self.job_runs = Counter("queen_job_runs", "Completed ticks of a background job", ["job"], registry=reg)
        self.job_errors = Counter("queen_job_errors", "Failed ticks of a background job", ["job"], registry=reg)
        self.job_items = Counter("queen_job_items", "Items a background job handled", ["job"], registry=reg)
        self.task_restarts = Counter(
            "queen_task_restarts", "Restarts of a supervised task after a crash", ["task"], registry=reg
        )
        build = Gauge("queen_build_info", "Version of queen-pg", ["version"], registry=reg, multiprocess_mode="max")
        build.labels(__version__).set(1)
        self.snapshot = SnapshotCollector()
        if self.multiprocess_dir:
            from prometheus_client.multiprocess import MultiProcessCollector

            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            self.exposed.register(self.snapshot)
        else:
            ProcessCollector(registry=reg)
            reg.register(self.snapshot)
            self.exposed = reg
        self._children: dict[tuple[Any, ...], Any] = {}
        self._seen: dict[tuple[int, str], float] = {}  # counters fed from cumulative values
        self._snapshot_at: float | None = None
        self._lock = asyncio.Lock()

    # ---- the request path ---------------------------------------------------------------------

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(self, method: str, route: str, status: int, seconds: float) -> None:
        self._child(self.requests, (method, route, str(status))).inc()
        self._child(self.latency, (method, route)).observe(seconds)

    def count_push(self, tenant: str, queued: int, dups: int) -> None:
        """A push's messages appended and duplicates (counted by the engine: ``push.Answer``)."""
        if queued:
            self._child(self.pushed, (tenant,)).inc(queued)
        if dups:
            self._child(self.duplicates, (tenant,)).inc(dups)

    def count_pop_claims(self, tenant: str, claimed: Iterable[tuple[str, str, int]]) -> None:
        """A pop's count (JSON or framed): (queue, partitionId, messages) per claimed partition."""
        n = sum(c[2] for c in claimed)
        if n:
            self._child(self.popped, (tenant,)).inc(n)

    def count_ack(self, tenant: str, items: Sequence[ack_engine.AckLike], results: Iterable[Mapping[str, Any]]) -> None:
        """Acks that applied (not refused, not a resend answered as ``noop``); results carry ``index``."""
        # ack_engine.AckResults counts without building its dicts
        counted = results.applied() if isinstance(results, ack_engine.AckResults) else None
        per_status: dict[str, int] = counted if counted is not None else {}
        for r in results if counted is None else ():
            if not r.get("success") or r.get("noop"):
                continue
            item = items[r["index"]]
            status = ack_engine.STATUSES.get(item.status, item.status)
            per_status[status] = per_status.get(status, 0) + 1
        for status, n in per_status.items():
            self._child(self.acked, (tenant, status)).inc(n)

    # ---- sampling, snapshot, exposition -------------------------------------------------------

    def _feed(self, metric: Any, label: str, total: float) -> None:
        """Feed a counter from a cumulative value kept elsewhere (job runs, task restarts)."""
        key = (id(metric), label)
        delta = total - self._seen.get(key, 0.0)
        if delta > 0:
            self._child(metric, (label,)).inc(delta)
            self._seen[key] = total

    def _feed2(self, metric: Any, labels: tuple[str, ...], total: float) -> None:
        """:meth:`_feed` for any label tuple (none included)."""
        key = (id(metric), "\x00".join(labels))
        delta = total - self._seen.get(key, 0.0)
        if delta > 0:
            (self._child(metric, labels) if labels else metric).inc(delta)
            self._seen[key] = total

    def sample(self, db: Database | None, waiters: Any, limiters: Any, supervisor: Any, mesh: Any = None) -> None:
        """Read the in-process gauges; every argument may be None (not there yet or not built)."""
        if mesh is not None:
            self.mesh_peers.set(mesh.connected)
            self.mesh_outbox.set(mesh.outbox_depth)
            self._feed(self.mesh_frames, "sent", mesh.frames_sent)
            self._feed(self.mesh_frames, "received", mesh.frames_received)
            self._feed(self.mesh_frames, "relayed", mesh.frames_relayed)
            self._feed(self.mesh_wakes, "filtered", mesh.wakes_filtered)
            self._feed(self.mesh_wakes, "caught_up", mesh.wakes_caught_up)
            for key, n in list(mesh.dropped.items()):
                direction, _, reason = key.partition(":")
                self._feed2(self.mesh_dropped, (direction, reason), n)
        if db is not None:
            try:
                pool = db.pool
            except QueenError:
                self.pool_size.set(0)
                self.pool_idle.set(0)
            else:
                self.pool_size.set(pool.get_size())
                self.pool_idle.set(db.idle_size())
            self.pool_max.set(db.size)
            cache = pop_render.cache_of(db)
            self.pop_cache_bytes.set(cache.bytes)
            stats = cache.stats
            for result, n in (("hit", stats.hits), ("miss", stats.misses), ("eviction", stats.evictions)):
                self._feed2(self.pop_cache, (result,), n)
        if waiters is not None:
            self.waiters.set(waiters.parked)
            self.waiters_limit.set(waiters.limit)
            self._feed2(self.probes, (), getattr(waiters, "probes", 0))
            self._feed2(self.skipped, (), getattr(waiters, "skipped", 0))
            self._feed2(self.lookups, (), getattr(waiters, "lookups", 0))
            self.scheduled_wakes.set(getattr(waiters, "scheduled", 0))
        if isinstance(limiters, Mapping):
            for family, limiter in limiters.items():
                try:
                    values = limiter.snapshot()
                except Exception:  # a limiter's bug must not break the scrape
                    log.exception("event=metrics_limiter_error family=%s", family)
                    continue
                for field, value in values.items():
                    self._child(self.limiter, (str(family), str(field))).set(float(value))
        if supervisor is not None:
            for name, job in getattr(supervisor, "jobs", {}).items():
                self._feed(self.job_runs, name, getattr(job, "runs", 0))
                self._feed(self.job_errors, name, getattr(job, "errors", 0))
                self._feed(self.job_items, name, getattr(job, "items", 0))
            for name in supervisor.names:
                self._feed(self.task_restarts, name, supervisor.restarts(name))

    async def refresh(self, db: Database) -> None:
        """Refresh the database snapshot unless it is younger than ``snapshot_max_age``."""
        async with self._lock:  # concurrent scrapes share one query
            now = time.monotonic()
            if self._snapshot_at is not None and now - self._snapshot_at < self.snapshot_max_age:
                return
            try:
                self.snapshot.snapshot = await metrics_engine.tenants(db)
                self.snapshot.db_up = True
            except QueenError as exc:
                log.warning("event=metrics_snapshot_error code=%s error=%s", exc.code, exc)
                self.snapshot.db_up = False
            self.snapshot.seconds = time.monotonic() - now
            self._snapshot_at = time.monotonic()

    def render(self) -> bytes:
        return generate_latest(self.exposed)

    async def run_sampler(self, db: Database, waiters: Any, limiters: Any, supervisor: Any, mesh: Any = None) -> None:
        """With several workers: keep this worker's gauges current for any scrape."""
        while True:
            self.sample(db, waiters, limiters, supervisor, mesh)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def close(self) -> None:
        """This worker is going away: drop its live gauges from the shared directory."""
        if self.multiprocess_dir:
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(os.getpid(), self.multiprocess_dir)  # type: ignore[no-untyped-call]
