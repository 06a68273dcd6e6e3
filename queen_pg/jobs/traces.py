"""trace_retention: delete traces older than ``trace_retention_hours`` through ``queen.traces_retention_v1``.

Oldest first, at most ``limit`` per call, repeated at once while a batch comes back full; one replica
per tick (``TRACES_RETENTION_LOCK``). Not started when the retention is 0 (traces kept forever).
"""

from __future__ import annotations

from queen_pg.engine import calls
from queen_pg.jobs.supervisor import JobConfig, Prune

CONFIG = JobConfig(name="trace_retention", interval=60.0, limit=1000)


class TraceRetention(Prune):
    sql = calls.TRACES_RETENTION
    default = CONFIG
    unit = "traces"

    def __init__(self, keep_hours: int, config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self.keep_seconds = keep_hours * 3600

    def args(self) -> tuple[object, ...]:
        return (self.keep_seconds,)
