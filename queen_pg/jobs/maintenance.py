"""maintenance_refresh: keep this process's maintenance switches current.

Every broker process (jobs enabled or not: each one gates its own pushes and pops) re-reads
``queen.system_settings`` every ``maintenance_refresh_ms`` (at most 1 s) through
``queen.system_settings_v1`` and applies it to its :class:`~queen_pg.engine.maintenance.Maintenance`
cache, so a switch flipped through any replica is obeyed by all of them within a second. There is no
leader: the read is one index lookup on a table of a few rows. A failed read keeps the last known
switches (a database that does not answer is not taken for "maintenance off"), is logged once as
``event=maintenance_refresh_error``, and is retried at the same pace, never backed off beyond the
interval, so the switches are current again within one interval of the database coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from queen_pg.db.pool import Database
from queen_pg.engine import maintenance
from queen_pg.jobs.supervisor import Supervisor

log = logging.getLogger("queen_pg.jobs")

NAME = "maintenance_refresh"


class MaintenanceRefresher:
    def __init__(self, db: Database, cache: maintenance.Maintenance, interval_s: float) -> None:
        self.db = db
        self.cache = cache
        self.interval_s = interval_s
        self.failing = False
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Re-read now rather than at the next tick (a peer flipped a switch: queen_pg/mesh/)."""
        self._kick.set()

    async def refresh_once(self) -> bool:
        """One read; False (and the cache untouched) when it failed."""
        before = (self.cache.push, self.cache.pop)
        try:
            await maintenance.refresh(self.db, self.cache)
        except Exception as exc:  # kept: the last known switches stay in force
            if not self.failing:
                log.warning("event=maintenance_refresh_error error=%s: %s", exc.__class__.__name__, exc)
            self.failing = True
            return False
        if self.failing:
            log.info("event=maintenance_refresh_recovered")
        self.failing = False
        if (self.cache.push, self.cache.pop) != before:
            log.info("event=maintenance_changed push=%s pop=%s", self.cache.push, self.cache.pop)
        return True

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._kick.wait()
            self._kick.clear()
            await self.refresh_once()


async def start_refresher(
    supervisor: Supervisor, db: Database, cache: maintenance.Maintenance, interval_s: float
) -> MaintenanceRefresher:
    """Read the switches once now (so a booting replica starts with them), then keep them current."""
    refresher = MaintenanceRefresher(db, cache, interval_s)
    await refresher.refresh_once()
    supervisor.start(NAME, refresher.run)
    return refresher
