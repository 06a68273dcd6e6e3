"""storage: the in-memory ``storage_full`` flag that refuses pushes (507) before the disk fills up.

Two sources, either one sets the flag:

* the filesystem of ``disk_path`` (``queen-pg serve`` sets it to the embedded PostgreSQL's data
  directory): full when its use, as ``df`` counts it, is at or above ``disk_high_pct``;
* ``db_max_bytes`` for an external database: full when ``pg_database_size(current_database())`` is
  above it (0 = no check).

Pushes never query anything for this: they read :attr:`StorageCheck.full`, which this job refreshes
every ``storage_check_ms`` (5 s) in every broker process (no leader: each process needs its own flag;
it is read-only). An error keeps the last value, so a database that does not answer is not taken for
an empty one. Pops and acks never look at the flag, so a backlog can drain while pushes are refused.
Logs ``event=storage_full`` / ``event=storage_ok`` once per transition.
"""

from __future__ import annotations

import logging
import shutil
from datetime import datetime
from pathlib import Path

from queen_pg.db.pool import Database
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

DB_SIZE_SQL = "SELECT pg_database_size(current_database())"


def disk_used_pct(path: Path) -> float:
    """Use of the filesystem holding ``path`` in percent, as ``df`` shows it (used / (used + available))."""
    usage = shutil.disk_usage(path)
    denominator = usage.used + usage.free
    return 100.0 * usage.used / denominator if denominator else 0.0


class StorageCheck(Job):
    def __init__(
        self, disk_path: Path | None, disk_high_pct: float, db_max_bytes: int, interval_s: float = 5.0
    ) -> None:
        super().__init__(JobConfig(name="storage", interval=interval_s, limit=1))
        self.disk_path = disk_path
        self.disk_high_pct = disk_high_pct
        self.db_max_bytes = db_max_bytes
        self.full = False
        self.reason = ""  # why it is full, for the 507 message

    @property
    def enabled(self) -> bool:
        return self.disk_path is not None or self.db_max_bytes > 0

    async def refresh(self, db: Database) -> bool:
        """Measure now and update the flag; returns it."""
        reasons: list[str] = []
        if self.disk_path is not None:
            pct = disk_used_pct(self.disk_path)
            if pct >= self.disk_high_pct:
                reasons.append(f"disk of {self.disk_path} is {pct:.1f} % full (limit {self.disk_high_pct:g} %)")
        if self.db_max_bytes > 0:
            size = int(await db.fetchval(DB_SIZE_SQL) or 0)
            if size > self.db_max_bytes:
                reasons.append(f"database is {size} bytes (budget {self.db_max_bytes})")
        full = bool(reasons)
        if full and not self.full:
            log.warning("event=storage_full %s", "; ".join(reasons))
        elif self.full and not full:
            log.info("event=storage_ok was=%r", self.reason)
        self.full = full
        self.reason = "; ".join(reasons)
        return full

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        if self.enabled:
            await self.refresh(db)
        return 0
