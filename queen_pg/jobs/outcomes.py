"""outcomes_prune: delete request outcomes past their window through ``queen.outcomes_prune_v1``.

Nothing depends on it for correctness: a record past its ``expires_at`` is never replayed (and a new
request under its key overwrites it), so this job only keeps ``queen.request_outcomes`` small. Records
a writer is replacing at that moment are skipped (SKIP LOCKED) and taken at a later tick.
"""

from __future__ import annotations

from queen_pg.engine import calls
from queen_pg.jobs.supervisor import JobConfig, Prune

CONFIG = JobConfig(name="outcomes_prune", interval=30.0, limit=1000)


class OutcomesPrune(Prune):
    sql = calls.OUTCOMES_PRUNE
    default = CONFIG
