"""timers: producer_sub, the scheduler's sub that the fired message carries

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

With JWT on every pushed message carries the pushing token's ``sub`` as its producerSub (frame flag 2);
a timer's message had none. The producer of a timer is the one who scheduled it: ``queen._timer_apply``
keeps the token's sub in ``timers.producer_sub`` and ``queen.timers_fire_v1`` frames it. Nullable (JWT
off, and timers scheduled before this revision: their messages fire without one, as before). The same
column is in ``sql/schema.sql``. Idempotent, like every revision here (see 0001_baseline.py).

downgrade() drops the column (the previous release's procedures do not read it).
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0011"
down_revision: str | None = "0010"


upgrade, downgrade = revision_steps(down="ALTER TABLE queen.timers DROP COLUMN IF EXISTS producer_sub;")
