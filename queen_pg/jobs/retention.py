"""retention: delete whole segments past their queue's retention through ``queen.retention_v1``.

A segment goes only when every consumer group of its partition is past it and none of its dead
letters still waits for dlq_fill; its dedup/ack hashes (log_txns) go with it, in one transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

CONFIG = JobConfig(name="retention", interval=30.0, limit=50)


class Retention(Job):
    def __init__(self, config: JobConfig = CONFIG) -> None:
        super().__init__(config)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Segments deleted by one call."""
        rows = await db.fetch(calls.RETENTION, self.config.limit, now)
        segments, txns = (rows[0]["segments"], rows[0]["txns"]) if rows else (0, 0)
        if segments:
            log.info("event=job_done job=%s segments=%d txns=%d", self.name, segments, txns)
        return int(segments)
