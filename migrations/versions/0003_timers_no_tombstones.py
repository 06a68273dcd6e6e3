"""timers: no tombstones (docs/wire.md#timers-no-tombstone)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A fired timer's row is now deleted by the fire (sql/procedures/086_timers.sql) instead of being kept
with ``fired_at`` for an hour. This revision deletes the tombstones of a database made before, drops
``fired_at`` and the two indexes built on it (``timers_due_idx``, partial on ``fired_at IS NULL``, and
``timers_fired_idx``), and creates ``timers_deliver_idx`` on ``deliver_at``: the shape ``sql/schema.sql``
gives a new database (its DO block makes the same change when boot meets an old table first).
Idempotent, like every revision here (see 0001_baseline.py).

downgrade() adds ``fired_at`` back (nullable: every remaining row is a pending timer) with the old
indexes; the previous release's procedures then work again.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0003"
down_revision: str | None = "0002"


upgrade, downgrade = revision_steps(
    down="""
    DROP INDEX IF EXISTS queen.timers_deliver_idx;
    ALTER TABLE queen.timers ADD COLUMN IF NOT EXISTS fired_at timestamptz;
    CREATE INDEX IF NOT EXISTS timers_due_idx ON queen.timers (deliver_at) WHERE fired_at IS NULL;
    CREATE INDEX IF NOT EXISTS timers_fired_idx ON queen.timers (fired_at) WHERE fired_at IS NOT NULL;
    """
)
