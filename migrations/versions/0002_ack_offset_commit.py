"""ack is an offset commit: drop log_consumers.acked, add log_passes, log_dlq without foreign keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

* ``log_consumers.acked`` (offsets completed out of order above the cursor) goes: an ack commits the
  cursor through its offset (docs/wire.md#ack-offset-commit), so a group's whole state in a partition is its cursor.
  Offsets a group must pass over (a dead letter requeued for another group, a message deleted ahead of
  the cursor) are rows of the new ``log_passes``. A cursor row that had offsets in ``acked`` keeps
  them pending: they are delivered again (at-least-once), which is what the new rule would do too.
* ``log_dlq`` loses its foreign key to ``log_partitions``: the ack inserts dead letters while it holds
  cursor rows, and the FK's KEY SHARE on the partition row went against the lock order
  (docs/architecture.md#lock-order); ``queen.delete_queue_v1`` deletes a queue's dead letters itself.

Idempotent (see 0001_baseline.py): it may run after boot already made these changes, or before.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0002"
down_revision: str | None = "0001"


upgrade, downgrade = revision_steps(
    down="""
    DROP TABLE IF EXISTS queen.log_passes;
    DROP INDEX IF EXISTS queen.log_dlq_partition_idx;
    ALTER TABLE queen.log_consumers ADD COLUMN IF NOT EXISTS acked bigint[] NOT NULL DEFAULT '{}';
    DELETE FROM queen.log_dlq d WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions p WHERE p.id = d.partition_id);
    ALTER TABLE queen.log_dlq DROP CONSTRAINT IF EXISTS log_dlq_partition_id_fkey;
    ALTER TABLE queen.log_dlq ADD CONSTRAINT log_dlq_partition_id_fkey
        FOREIGN KEY (partition_id) REFERENCES queen.log_partitions (id) ON DELETE CASCADE;
    """
)
