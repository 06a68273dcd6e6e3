"""maintenance_refresh: keep this process's maintenance switches current.

Every broker process (jobs enabled or not: each one gates its own pushes and pops) re-reads
``queen.system_settings`` every ``maintenance_refresh_ms`` (at most 1 s) through
``queen.system_settings_v1`` and applies it to its :class:`~queen_pg.engine.maintenance.Maintenance`
cache, so a switch flipped through any replica is obeyed by all of them within a second. There is no
leader: the read is one index lookup on a table of a few rows. A failed read keeps the last known
switches (a database that does not answer is not taken for "maintenance off"), is logged once as
``event=maintenance_refresh_error``, and is retried at the same pace, never backed off beyond the
interval, so the switches are current again within one interval of the database coming back.

The workers of one ``queen-pg serve --workers N`` share the work (``queen_pg/mesh/``): one of them
(:meth:`~queen_pg.mesh.node.Mesh.polls_for_siblings`, the lowest pid) reads every interval and, when
a timed read finds the switches changed, sends a MAINTENANCE frame; the others re-read on that frame
(and on a flip through a sibling, which sends one too) and otherwise only every ``fallback_s`` (5 s),
in case a frame was lost. So a switch flipped anywhere is obeyed by every worker within one interval
plus a Unix-socket hop (milliseconds), as before; only a frame lost between siblings (one of them
restarting) stretches that to the fallback. A lone process, or a replica whose workers have no
siblings, reads every interval as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from queen_pg.db.pool import Database
from queen_pg.engine import maintenance
from queen_pg.jobs.supervisor import Supervisor

log = logging.getLogger("queen_pg.jobs")

NAME = "maintenance_refresh"
FALLBACK_S = 5.0  # a worker whose sibling reads for it re-reads this often anyway


def _always() -> bool:
    return True


def _nothing() -> None:
    return None


class MaintenanceRefresher:
    def __init__(
        self, db: Database, cache: maintenance.Maintenance, interval_s: float, fallback_s: float = FALLBACK_S
    ) -> None:
        self.db = db
        self.cache = cache
        self.interval_s = interval_s
        self.fallback_s = max(fallback_s, interval_s)
        self.failing = False
        self.polls: Callable[[], bool] = _always  # read every interval? (mesh: the sibling that reads for all)
        self.relay: Callable[[], None] = _nothing  # tell the others a change a timed read found (mesh)
        self._kick = asyncio.Event()

    def delay(self) -> float:
        """Seconds to the next timed read."""
        return self.interval_s if self.polls() else self.fallback_s

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
            kicked = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.delay()):
                    await self._kick.wait()
                    kicked = True
            self._kick.clear()
            before = (self.cache.push, self.cache.pop)
            if await self.refresh_once() and not kicked and (self.cache.push, self.cache.pop) != before:
                self.relay()  # a kicked read's news came from a peer, which told everyone already


async def start_refresher(
    supervisor: Supervisor, db: Database, cache: maintenance.Maintenance, interval_s: float
) -> MaintenanceRefresher:
    """Read the switches once now (so a booting replica starts with them), then keep them current."""
    refresher = MaintenanceRefresher(db, cache, interval_s)
    await refresher.refresh_once()
    supervisor.start(NAME, refresher.run)
    return refresher
