"""stats: per-minute throughput and lag per queue, through ``queen.stats_sample_v1``.

Each tick samples the queues not sampled in the last half interval whose pushed counter (sum of
``log_partitions.next_offset``) or settled counter (sum of ``log_consumers.acked_total``) moved since
their previous sample (an idle queue is skipped: no sample, no write): the growth goes to the row of the
current minute in ``queen.stats_minutes``, with the sample's backlog and lag, and each tenant's minute
row in ``queen.tenant_minutes`` gets the sums (backlog and lag over every queue's last sample).
``GET /api/v1/status/analytics`` and the status routes read those rows. The same call deletes rows older
than ``stats_retention_hours``. One replica per tick (``STATS_LOCK``);
a batch that comes back full (more queues than ``limit``) is followed at once by the next.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

# limit: queues sampled per call. Each call makes one hashed pass over log_partitions and log_consumers to
# find the queues that moved (~0.3 s at 100,000 queues on the 2-core box), so a tick that must sample many
# (the first one, or a busy world) takes few large calls rather than many small ones.
CONFIG = JobConfig(name="stats", interval=10.0, limit=5000)


class Stats(Job):
    def __init__(self, keep_hours: int = 168, config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self.keep_seconds = keep_hours * 3600

    @property
    def min_gap_seconds(self) -> int:
        """A queue is sampled again once this long has passed: half the interval, so every tick
        samples every queue once, and a repeated call within a tick only takes the ones left."""
        return max(int(self.config.interval / 2), 1)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Queues sampled (or old rows pruned, whichever is more) by one call."""
        rows = await db.fetch(calls.STATS_SAMPLE, self.config.limit, self.min_gap_seconds, self.keep_seconds, now)
        queues, pruned = (rows[0]["queues"], rows[0]["pruned"]) if rows else (0, 0)
        if pruned:
            log.info("event=job_done job=%s queues=%d pruned=%d", self.name, queues, pruned)
        return int(max(queues, pruned))


SNAPSHOT_CONFIG = JobConfig(name="stats_snapshot", interval=5.0, limit=100)
SNAPSHOT_MAX_SHARE = 0.1  # the pass may keep PostgreSQL busy at most this share of the time


class StatsSnapshot(Job):
    """The per-tenant counts of ``/status``, ``/resources/overview`` and ``/metrics``
    (``queen.tenant_stats``, ``sql/procedures/098_stats_snapshot.sql``): each tick recomputes up to
    ``limit`` tenants not refreshed in the last half interval, one set-based pass per tenant, so those
    reads are a primary-key probe and their ``asOf`` is at most about one interval old. A pass that takes
    long (about 35 µs per queue: 3.5 s at 100,000 queues) stretches the sleep to ten times its duration,
    so the pass never keeps PostgreSQL busy more than a tenth of the time; ``asOf`` is older then."""

    def __init__(self, config: JobConfig = SNAPSHOT_CONFIG) -> None:
        super().__init__(config)
        self.last_pass_s = 0.0

    def idle_delay(self) -> float:
        return max(self.config.interval, self.last_pass_s / SNAPSHOT_MAX_SHARE)

    @property
    def min_gap_seconds(self) -> int:
        return max(int(self.config.interval / 2), 0)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Tenants refreshed (0: none due, or another replica holds STATS_SNAPSHOT_LOCK)."""
        started = time.monotonic()
        n = int(await db.fetchval(calls.STATS_SNAPSHOT, self.config.limit, self.min_gap_seconds, now) or 0)
        if n:
            self.last_pass_s = time.monotonic() - started
        return n

    async def tick(self, db: Database, now: datetime | None = None) -> int:
        """Batches while they come back full, for at most ``min_gap_seconds``: a tenant this tick
        refreshed is due again that long after, and taking it again would never end the tick (more
        tenants than ``limit`` with a sweep longer than the gap, or a gap of 0): PostgreSQL busy all the
        time instead of a tenth of it. The tenants left are the oldest, the next tick's first."""
        started = time.monotonic()
        total = 0
        while True:
            done = await self.run_once(db, now)
            total += done
            if not self.more(done) or time.monotonic() - started >= self.min_gap_seconds:
                break
        if total:
            self.last_pass_s = time.monotonic() - started  # the whole tick: what the sleep stretches by
        return total
