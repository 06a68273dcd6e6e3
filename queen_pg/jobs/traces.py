"""trace_retention: delete traces older than ``trace_retention_hours`` through ``queen.traces_retention_v1``.

Oldest first, at most ``limit`` per call, repeated at once while a batch comes back full; one replica
per tick (``TRACES_RETENTION_LOCK``). Not started when the retention is 0 (traces kept forever).
"""

from __future__ import annotations

import logging
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

TRACES_RETENTION_SQL = "SELECT queen.traces_retention_v1($1, $2, $3)"
CONFIG = JobConfig(name="trace_retention", interval=60.0, limit=1000)


class TraceRetention(Job):
    def __init__(self, keep_hours: int, config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self.keep_seconds = keep_hours * 3600

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Traces deleted by one call."""
        deleted = int(await db.fetchval(TRACES_RETENTION_SQL, self.config.limit, self.keep_seconds, now) or 0)
        if deleted:
            log.info("event=job_done job=%s traces=%d", self.name, deleted)
        return deleted
