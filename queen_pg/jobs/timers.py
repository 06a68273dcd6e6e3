"""timers: fire due timers into their queues through ``queen.timers_fire_v1`` and wake parked pops.

One call fires up to ``limit`` due timers (each pushed once as a message with ``transactionId ==
txn``, ``id == messageId``, ``data ==`` payload; exactly once across replicas: leadership per tick,
the timer key's lock, and the push's dedup by txn); a fired timer's row is deleted with its push (no
tombstone, docs/wire.md#timers-no-tombstone), so a timer scheduled with a delivery time in the past fires on the first
cycle. ``on_fired(tenant, queue)`` is told which queues got a message, so pops parked on them on this
process claim at once. A timer is due at ``deliverAt`` ("not before"); it lands within about one
interval after it (a timer whose key a writer holds waits for the next tick).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.engine import timers as timers_engine
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

CONFIG = JobConfig(name="timers", interval=0.5, limit=500)


def _nobody(tenant: str, queue: str) -> None:
    """No parked pops to wake (tools and tests that fire outside a broker)."""


class TimersJob(Job):
    def __init__(self, on_fired: Callable[[str, str], None] = _nobody, config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self.on_fired = on_fired

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Timers fired (pushed or found duplicate) by one call."""
        res = await timers_engine.fire(db, self.config.limit, now)
        for tenant, queue in res.queues:
            self.on_fired(tenant, queue)
        done = res.fired + res.duplicates
        if done or res.busy:
            log.info(
                "event=job_done job=%s fired=%d duplicates=%d busy=%d",
                self.name,
                res.fired,
                res.duplicates,
                res.busy,
            )
        return done
