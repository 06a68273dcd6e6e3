"""outcomes_prune: delete request outcomes past their window through ``queen.outcomes_prune_v1``.

Nothing depends on it for correctness: a record past its ``expires_at`` is never replayed (and a new
request under its key overwrites it), so this job only keeps ``queen.request_outcomes`` small. Records
a writer is replacing at that moment are skipped (SKIP LOCKED) and taken at a later tick.
"""

from __future__ import annotations

import logging
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

OUTCOMES_PRUNE_SQL = "SELECT queen.outcomes_prune_v1($1, $2)"
CONFIG = JobConfig(name="outcomes_prune", interval=30.0, limit=1000)


class OutcomesPrune(Job):
    def __init__(self, config: JobConfig = CONFIG) -> None:
        super().__init__(config)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Dead records deleted by one call (0 when another replica holds OUTCOMES_PRUNE_LOCK)."""
        deleted = int(await db.fetchval(OUTCOMES_PRUNE_SQL, self.config.limit, now) or 0)
        if deleted:
            log.info("event=job_done job=%s rows=%d", self.name, deleted)
        return deleted
