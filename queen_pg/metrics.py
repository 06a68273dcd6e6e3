"""Prometheus metrics of one broker app: what ``GET /metrics`` exposes.

Three kinds of numbers, three ways to get them:

* **Counted on the request path** (HTTP requests and latency per route template, messages pushed,
  popped and acked per queue): plain prometheus-client counters and histograms; the label children
  are cached so a hot-path update is a dict lookup and an increment.
* **Sampled in this process** (pool connections, parked long-polls, limiter limits, background-job
  runs): :meth:`Metrics.sample` reads them just before a scrape.
* **Read from PostgreSQL** (partitions, backlog, lag per queue and group, DLQ depth): ONE call to
  ``queen.metrics_snapshot_v1`` per scrape, reused for ``snapshot_max_age`` seconds, never a query per
  request (:class:`SnapshotCollector`).

Every app has its own :class:`~prometheus_client.CollectorRegistry` (tests build many apps in one
process). With several uvicorn workers (``queen-pg serve --workers N``) the CLI sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start: counters and histograms then live in files
there and a scrape, whichever worker answers it, sums every worker's (prometheus-client's
multiprocess mode); per-process gauges are summed over live workers (limiter gauges keep a ``pid``
label), and each worker samples them every second. The database snapshot is global by nature.

An ack names its message by partition id only: the queue of a partition is learned from push and pop
answers of this process; ids it has not seen are counted aside and named at the next scrape (or
sampling tick) with one call to ``queen.metrics_partition_queues_v1``.
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
from queen_pg.errors import QueenError

log = logging.getLogger("queen_pg.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
UNMATCHED = "<unmatched>"  # the route label of a request no route matched (404s): bounded cardinality
UNKNOWN_QUEUE = "<deleted>"  # acks of a partition that no longer exists when its id is resolved
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_KNOWN_PARTITIONS = 100_000  # partition id -> queue cache; cleared (and relearned) when full
MAX_PENDING_ACKS = 100_000  # distinct (partition id, status) awaiting a name; beyond it: UNKNOWN_QUEUE
SAMPLE_INTERVAL_S = 1.0  # per-worker sampling with several workers


class SnapshotCollector:
    """The gauges read from the database: rendered from the last snapshot at collection time."""

    def __init__(self) -> None:
        self.snapshot: metrics_engine.Snapshot | None = None
        self.db_up = False
        self.seconds = 0.0  # how long the last snapshot query took

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("queen_db_up", "1 when the last metrics snapshot query succeeded")
        up.add_metric([], 1.0 if self.db_up else 0.0)
        yield up
        took = GaugeMetricFamily("queen_metrics_snapshot_seconds", "Duration of the last metrics snapshot query")
        took.add_metric([], self.seconds)
        yield took
        snap = self.snapshot
        if snap is None:
            return
        q_labels = ["tenant", "queue"]
        g_labels = ["tenant", "queue", "consumer_group"]
        partitions = GaugeMetricFamily("queen_queue_partitions", "Partitions of the queue", labels=q_labels)
        written = GaugeMetricFamily(
            "queen_queue_messages_written", "Messages ever written to the queue (sum of next offsets)", labels=q_labels
        )
        backlog = GaugeMetricFamily(
            "queen_queue_backlog", "Messages not yet done by the queue's most lagging consumer group", labels=q_labels
        )
        dlq = GaugeMetricFamily("queen_queue_dlq_depth", "Dead letters of the queue", labels=q_labels)
        lag = GaugeMetricFamily("queen_group_lag_messages", "Messages not yet done by the group", labels=g_labels)
        lag_s = GaugeMetricFamily(
            "queen_group_lag_seconds", "Age of the oldest message not yet done by the group", labels=g_labels
        )
        leased = GaugeMetricFamily(
            "queen_group_leased_partitions", "Partitions the group holds a live lease on", labels=g_labels
        )
        g_dlq = GaugeMetricFamily("queen_group_dlq_depth", "Dead letters of the group", labels=g_labels)
        worst: dict[tuple[str, str], int] = {}
        for g in snap.groups:
            key = [g.tenant, g.queue, g.group]
            lag.add_metric(key, g.lag)
            lag_s.add_metric(key, g.lag_seconds)
            leased.add_metric(key, g.leased_partitions)
            g_dlq.add_metric(key, g.dlq)
            worst[(g.tenant, g.queue)] = max(worst.get((g.tenant, g.queue), 0), g.lag)
        for q in snap.queues:
            key = [q.tenant, q.queue]
            partitions.add_metric(key, q.partitions)
            written.add_metric(key, q.messages)
            backlog.add_metric(key, worst.get((q.tenant, q.queue), 0))
            dlq.add_metric(key, q.dlq)
        yield from (partitions, written, backlog, dlq, lag, lag_s, leased, g_dlq)


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
        q = ["tenant", "queue"]
        self.pushed = Counter("queen_messages_pushed", "Messages appended by POST /push", q, registry=reg)
        self.duplicates = Counter(
            "queen_messages_push_duplicates",
            "Pushed items refused as duplicates of a stored transactionId",
            q,
            registry=reg,
        )
        self.popped = Counter("queen_messages_popped", "Messages delivered by pops", q, registry=reg)
        self.acked = Counter(
            "queen_messages_acked", "Messages settled by acks, by status", [*q, "status"], registry=reg
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
            "truncated, malformed, version, no_hello)",
            ["direction", "reason"],
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
        self._partition_queue: dict[str, tuple[str, str]] = {}  # partition id -> (tenant, queue)
        self._pending_acks: dict[tuple[str, str], int] = {}  # (partition id, status) -> count
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

    def _learn(self, partition_id: str, tenant: str, queue: str) -> None:
        known = self._partition_queue
        if partition_id not in known:
            if len(known) >= MAX_KNOWN_PARTITIONS:
                known.clear()
            known[partition_id] = (tenant, queue)

    def count_push(self, tenant: str, results: Iterable[Mapping[str, Any]]) -> None:
        queued: dict[str, int] = {}
        dups: dict[str, int] = {}
        last_pid: object = None
        for r in results:
            queue = r["queue"]
            if r["status"] == "queued":
                queued[queue] = queued.get(queue, 0) + 1
            else:
                dups[queue] = dups.get(queue, 0) + 1
            pid = r["partitionId"]
            if pid != last_pid:  # the items of one partition come together: learn it once
                self._learn(str(pid), tenant, queue)
                last_pid = pid
        for queue, n in queued.items():
            self._child(self.pushed, (tenant, queue)).inc(n)
        for queue, n in dups.items():
            self._child(self.duplicates, (tenant, queue)).inc(n)

    def count_pop(self, tenant: str, answer: Mapping[str, Any] | None) -> None:
        if not answer:
            return
        per_queue: dict[str, int] = {}
        last_pid: object = None
        for m in answer.get("messages", ()):
            queue = m["queue"]
            per_queue[queue] = per_queue.get(queue, 0) + 1
            pid = m["partitionId"]
            if pid != last_pid:
                self._learn(str(pid), tenant, queue)
                last_pid = pid
        for queue, n in per_queue.items():
            self._child(self.popped, (tenant, queue)).inc(n)

    def count_pop_claims(self, tenant: str, claimed: Iterable[tuple[str, str, int]]) -> None:
        """A framed pop's count: (queue, partitionId, messages) per claimed partition."""
        for queue, pid, n in claimed:
            self._learn(pid, tenant, queue)
            self._child(self.popped, (tenant, queue)).inc(n)

    def count_ack(self, items: Sequence[ack_engine.AckItem], results: Iterable[Mapping[str, Any]]) -> None:
        """Acks that applied (not refused, not a resend answered as ``noop``); results carry ``index``."""
        known = self._partition_queue
        for r in results:
            if not r.get("success") or r.get("noop"):
                continue
            item = items[r["index"]]
            pid, status = item.partition_id, ack_engine.STATUSES.get(item.status, item.status)
            where = known.get(pid)
            if where is not None:
                self._child(self.acked, (*where, status)).inc()
            elif len(self._pending_acks) < MAX_PENDING_ACKS or (pid, status) in self._pending_acks:
                self._pending_acks[(pid, status)] = self._pending_acks.get((pid, status), 0) + 1
            else:
                self._child(self.acked, ("", UNKNOWN_QUEUE, status)).inc()

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
                self.pool_idle.set(pool.get_idle_size())
            self.pool_max.set(db.size)
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

    async def resolve_acks(self, db: Database) -> None:
        """Name the queue of acked partitions this process has not seen: one call, if any."""
        if not self._pending_acks:
            return
        pending, self._pending_acks = self._pending_acks, {}
        ids = sorted({int(pid) for pid, _ in pending})
        try:
            found = await metrics_engine.partition_queues(db, ids)
        except QueenError:
            for key, n in pending.items():  # try again next time
                self._pending_acks[key] = self._pending_acks.get(key, 0) + n
            raise
        for (pid, status), n in pending.items():
            where = found.get(int(pid))
            if where is not None:
                self._learn(pid, *where)
            self._child(self.acked, (*(where or ("", UNKNOWN_QUEUE)), status)).inc(n)

    async def refresh(self, db: Database) -> None:
        """Refresh the database snapshot unless it is younger than ``snapshot_max_age``."""
        async with self._lock:  # concurrent scrapes share one query
            now = time.monotonic()
            if self._snapshot_at is not None and now - self._snapshot_at < self.snapshot_max_age:
                return
            try:
                await self.resolve_acks(db)
                self.snapshot.snapshot = await metrics_engine.snapshot(db)
                self.snapshot.db_up = True
            except QueenError as exc:
                log.warning("event=metrics_snapshot_error code=%s error=%s", exc.code, exc)
                self.snapshot.db_up = False
            self.snapshot.seconds = time.monotonic() - now
            self._snapshot_at = time.monotonic()

    def render(self) -> bytes:
        return generate_latest(self.exposed)

    async def run_sampler(self, db: Database, waiters: Any, limiters: Any, supervisor: Any, mesh: Any = None) -> None:
        """With several workers: keep this worker's gauges and ack names current for any scrape."""
        while True:
            self.sample(db, waiters, limiters, supervisor, mesh)
            try:
                await self.resolve_acks(db)
            except QueenError as exc:
                log.warning("event=metrics_resolve_error code=%s error=%s", exc.code, exc)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def close(self) -> None:
        """This worker is going away: drop its live gauges from the shared directory."""
        if self.multiprocess_dir:
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(os.getpid(), self.multiprocess_dir)  # type: ignore[no-untyped-call]
