"""kv_sweep: delete expired KV rows through ``queen.kv_sweep_v1``.

Nothing depends on it for correctness: an expired row (expires_at <= now) is already absent to every
read and write (sql/procedures/080_kv.sql), so this job only keeps the table and its index small. Rows
a writer is rewriting at that moment are skipped (SKIP LOCKED) and taken at a later tick.
"""

from __future__ import annotations

import logging
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

KV_SWEEP_SQL = "SELECT queen.kv_sweep_v1($1, $2)"
CONFIG = JobConfig(name="kv_sweep", interval=30.0, limit=1000)


class KvSweep(Job):
    def __init__(self, config: JobConfig = CONFIG) -> None:
        super().__init__(config)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Expired rows deleted by one call (0 when another replica holds KV_SWEEP_LOCK)."""
        deleted = int(await db.fetchval(KV_SWEEP_SQL, self.config.limit, now) or 0)
        if deleted:
            log.info("event=job_done job=%s rows=%d", self.name, deleted)
        return deleted
