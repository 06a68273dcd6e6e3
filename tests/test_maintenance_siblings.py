"""The maintenance switches between the workers of one host (queen_pg/jobs/maintenance.py,
Mesh.polls_for_siblings): one worker, the lowest pid, reads them every interval and tells its siblings
of a change a timed read found; the others re-read on that news and otherwise only at the slow
fallback. Real meshes over Unix sockets in a temporary directory, a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from queen_pg.engine import maintenance
from queen_pg.jobs.maintenance import FALLBACK_S, MaintenanceRefresher
from tests.helpers import eventually
from tests.test_mesh import Sibling, _siblings, _stop_siblings


def wire(w: Sibling, refresher: MaintenanceRefresher) -> list[int]:
    """As create_app wires them; returns a list that counts the refresher's relays."""
    relays: list[int] = []

    def relay() -> None:
        relays.append(1)
        w.mesh.publish_maintenance()

    refresher.polls, refresher.relay = w.mesh.polls_for_siblings, relay
    w.mesh.on_siblings = refresher.kick
    w.mesh.on_maintenance = refresher.kick
    return relays


async def test_the_lowest_pid_reads_for_its_siblings_and_a_successor_takes_over(tmp_path: Path) -> None:
    w1, w2, tasks = await _siblings(tmp_path)  # w2 serves "1.sock": the lowest pid
    try:
        await eventually(lambda: w2.mesh.polls_for_siblings(), "w2 to read for both")
        assert not w1.mesh.polls_for_siblings()
        changed: list[int] = []
        w1.mesh.on_siblings = lambda: changed.append(1)
        assert w2.server is not None
        w2.server.close()  # w2 goes away: its socket file with it
        with contextlib.suppress(FileNotFoundError):
            (tmp_path / "mesh" / "1.sock").unlink()
        await eventually(lambda: w1.mesh.polls_for_siblings(), "w1 to read for itself once w2 is gone")
        assert changed, "the refresher was told the siblings changed"
    finally:
        await _stop_siblings(tasks, w1, w2)


def test_a_worker_without_siblings_reads_at_the_interval() -> None:
    r = MaintenanceRefresher(db=None, cache=maintenance.Maintenance(), interval_s=0.5)  # type: ignore[arg-type]
    assert r.delay() == 0.5  # a lone process, as before
    r.polls = lambda: False
    assert r.delay() == FALLBACK_S == 5.0
    assert MaintenanceRefresher(None, maintenance.Maintenance(), 1.0, fallback_s=0.1).delay() == 1.0  # type: ignore[arg-type]


async def test_a_switch_the_reader_finds_reaches_the_sibling_that_reads_only_hourly(tmp_path: Path, db: Any) -> None:
    w1, w2, tasks = await _siblings(tmp_path)
    c1, c2 = maintenance.Maintenance(), maintenance.Maintenance()
    r1 = MaintenanceRefresher(db, c1, interval_s=0.05, fallback_s=3600)
    r2 = MaintenanceRefresher(db, c2, interval_s=0.05, fallback_s=3600)
    relays1, relays2 = wire(w1, r1), wire(w2, r2)
    await eventually(lambda: r2.delay() == 0.05 and r1.delay() == 3600, "w2 to read for both, w1 to follow")
    runs = [asyncio.create_task(r1.run()), asyncio.create_task(r2.run())]
    try:
        # flipped elsewhere (another replica without a mesh, or psql): only a timed read can find it
        await maintenance.set_switch(db, maintenance.Maintenance(), "push", True)
        await eventually(lambda: c2.push, "the reader's timed read")
        await eventually(lambda: c1.push, "the follower's read on the reader's news (its own is an hour away)")
        assert relays2 == [1] and relays1 == []  # a read on news is not news again: no echo
        await maintenance.set_switch(db, maintenance.Maintenance(), "push", False)
        await eventually(lambda: not c1.push and not c2.push, "the switch back, the same way")
        assert relays2 == [1, 1] and relays1 == []
    finally:
        for t in runs:
            t.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await _stop_siblings(tasks, w1, w2)


async def test_a_follower_whose_news_is_lost_still_reads_at_the_fallback(db: Any) -> None:
    cache = maintenance.Maintenance()
    r = MaintenanceRefresher(db, cache, interval_s=0.05, fallback_s=0.2)
    r.polls = lambda: False  # a sibling reads for it, but its frames never arrive (no mesh here)
    run = asyncio.create_task(r.run())
    try:
        await maintenance.set_switch(db, maintenance.Maintenance(), "pop", True)
        await eventually(lambda: cache.pop, "the fallback read")
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
