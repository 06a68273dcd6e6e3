"""log_consumers.head_at and the ready index: pop discovery without a scan

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

``head_at`` is the time of the segment holding a cursor while its group has a message at or above it in
the partition, NULL when the cursor is caught up. ``log_consumers_ready_idx`` on ``(queue_id,
consumer_group, head_at, partition_id)`` lets a pop take its group's oldest pending partitions without
visiting the others; it replaces ``log_consumers_queue_group_idx`` (the same prefix). The same changes
are in ``sql/schema.sql``.

The column is filled, and kept from then on, by the triggers that boot creates from
``sql/procedures/001_internal.sql`` (created once, with the fill, under a SHARE lock on log_partitions so
no push is halfway): a revision never touches functions or triggers (see 0001_baseline.py). Until the
release's procedures are applied the column is unused (the previous release's pop does not read it).

downgrade() drops the index and the column (and the triggers and their functions, which read it),
and makes the previous index again.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0006"
down_revision: str | None = "0005"


upgrade, downgrade = revision_steps(
    down="""
    DROP TRIGGER IF EXISTS log_consumers_head_ins ON queen.log_consumers;
    DROP TRIGGER IF EXISTS log_consumers_head_upd ON queen.log_consumers;
    DROP FUNCTION IF EXISTS queen._cursor_head_trg();
    DROP FUNCTION IF EXISTS queen._wake_cursors(bigint[], timestamptz[]);
    DROP FUNCTION IF EXISTS queen._cursor_head(bigint, bigint);
    CREATE INDEX IF NOT EXISTS log_consumers_queue_group_idx
        ON queen.log_consumers (queue_id, consumer_group);
    DROP INDEX IF EXISTS queen.log_consumers_ready_idx;
    ALTER TABLE queen.log_consumers DROP COLUMN IF EXISTS head_at;
    """
)
