"""Background jobs: lease expiry, retention, DLQ payload fill, timer firing, expired-KV sweep, stats
samples, the per-tenant status snapshot, trace retention; and the supervisor that runs them (plus the
maintenance refresher, which is not a job: every process runs it, see ``queen_pg/jobs/maintenance.py``).

Invariants:
- A job is a small config (name, interval, batch limit) and a ``run_once`` that makes ONE bounded
  stored-procedure call (``sql/procedures/060_jobs.sql``) and returns how much it did; the loop
  repeats it at once while a batch came back full, else sleeps its interval with jitter.
- Leadership per tick: each procedure starts with ``pg_try_advisory_xact_lock`` on its own key
  (docs/architecture.md#advisory-keys, ``queen_pg/db/locks.py``); a replica that does not get it does
  nothing, so running jobs on every replica is safe and the work is done once.
- Jobs decide nothing the hot paths rely on for correctness: pops claim expired leases without
  lease_expiry, and a lost wake-up costs latency, never a message. Retention never deletes a segment
  a cursor of any group still needs, nor one whose dead letters await their payload.
- Every background task runs under :class:`~queen_pg.jobs.supervisor.Supervisor`: named, restarted
  after a crash (or the process stopped, for a critical task), cancelled and awaited at shutdown,
  before the pool closes. Errors are logged as ``event=job_error`` and survived with backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from queen_pg.db.pool import Database
from queen_pg.jobs.dlq_fill import DlqFill
from queen_pg.jobs.kv_sweep import KvSweep
from queen_pg.jobs.lease_expiry import LeaseExpiry
from queen_pg.jobs.outcomes import OutcomesPrune
from queen_pg.jobs.retention import Retention
from queen_pg.jobs.stats import SNAPSHOT_CONFIG, Stats, StatsSnapshot
from queen_pg.jobs.supervisor import Job, Supervisor
from queen_pg.jobs.timers import TimersJob
from queen_pg.jobs.traces import TraceRetention


def default_jobs(
    on_claimable: Callable[[str, str], None],
    stats_keep_hours: int = 168,
    trace_keep_hours: int = 168,
    stats_snapshot_interval: float = SNAPSHOT_CONFIG.interval,
) -> list[Job]:
    """The broker's jobs; ``on_claimable(tenant, queue)`` wakes pops parked on a queue. The stats job
    prunes its rows after ``stats_keep_hours`` (0 = never); trace retention runs when
    ``trace_keep_hours`` > 0."""
    jobs: list[Job] = [LeaseExpiry(on_claimable), Retention(), DlqFill(), TimersJob(on_claimable), KvSweep()]
    jobs.append(OutcomesPrune())  # request outcomes past their window (sql/procedures/096_outcomes.sql)
    jobs.append(Stats(stats_keep_hours))
    jobs.append(StatsSnapshot(replace(SNAPSHOT_CONFIG, interval=stats_snapshot_interval)))
    if trace_keep_hours > 0:
        jobs.append(TraceRetention(trace_keep_hours))
    return jobs


def start_jobs(
    supervisor: Supervisor,
    db: Database,
    on_claimable: Callable[[str, str], None],
    stats_keep_hours: int = 168,
    trace_keep_hours: int = 168,
    stats_snapshot_interval: float = SNAPSHOT_CONFIG.interval,
) -> None:
    for job in default_jobs(on_claimable, stats_keep_hours, trace_keep_hours, stats_snapshot_interval):
        supervisor.start_job(job, db)
