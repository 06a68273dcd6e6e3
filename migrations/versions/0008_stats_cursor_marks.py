"""stats_marks.cursors_total: a queue whose cursors moved without an ack is sampled again

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

The stats job samples a queue only when it moved since its mark (revision 0007). Its pushed and acked
counters miss a cursor created, deleted or moved without an ack (a queue cleared, a group sought or
deleted), which changes the queue's backlog and lag: the mark now also keeps the cursors'
sum(cursor_offset + 1), and a queue whose sum differs (or is NULL, as after this revision) is sampled.
The same change is in ``sql/schema.sql``.

downgrade() drops the column.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0008"
down_revision: str | None = "0007"


upgrade, downgrade = revision_steps(down="ALTER TABLE queen.stats_marks DROP COLUMN IF EXISTS cursors_total;")
