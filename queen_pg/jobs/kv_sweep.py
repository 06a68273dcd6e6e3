"""kv_sweep: delete expired KV rows through ``queen.kv_sweep_v1``.

Nothing depends on it for correctness: an expired row (expires_at <= now) is already absent to every
read and write (sql/procedures/080_kv.sql), so this job only keeps the table and its index small. Rows
a writer is rewriting at that moment are skipped (SKIP LOCKED) and taken at a later tick.
"""

from __future__ import annotations

from queen_pg.engine import calls
from queen_pg.jobs.supervisor import JobConfig, Prune

CONFIG = JobConfig(name="kv_sweep", interval=30.0, limit=1000)


class KvSweep(Prune):
    sql = calls.KV_SWEEP
    default = CONFIG
