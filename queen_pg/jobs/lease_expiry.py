"""lease_expiry: clear expired leases through ``queen.lease_expiry_v1`` and wake parked pops.

Pops already treat an expired lease as claimable, so this job only makes the cursor rows honest
(no lease shown after it expired) and tells ``on_claimable(tenant, queue)`` which queues got
partitions back, so pops parked on them on this process claim at once instead of at their next poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

CONFIG = JobConfig(name="lease_expiry", interval=5.0, limit=1000)


class LeaseExpiry(Job):
    def __init__(self, on_claimable: Callable[[str, str], None], config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self.on_claimable = on_claimable

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Leases cleared by one call."""
        rows = await db.fetch(calls.LEASE_EXPIRY, self.config.limit, now)
        cleared = 0
        for row in rows:
            cleared += row["leases"]
            self.on_claimable(row["tenant"], row["queue"])
        if cleared:
            log.info("event=job_done job=%s leases=%d queues=%d", self.name, cleared, len(rows))
        return cleared
