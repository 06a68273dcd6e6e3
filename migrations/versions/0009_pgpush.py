"""log_txns without its foreign key to log_partitions: the key check per pushed message was ~40 % of
PostgreSQL's CPU per message in a 100-item push

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Every writer of log_txns (push, DLQ requeue) holds the partition row and inserts the rows' segment in
the same transaction (log_segments keeps its foreign key, so a partition deleted under it still fails
the call), and ``queen.delete_queue_v1`` deletes the queue's log_txns rows itself before the cascade.
The same change is in ``sql/schema.sql``.

downgrade() deletes orphan rows (if any) and puts the foreign key back.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0009"
down_revision: str | None = "0008"


upgrade, downgrade = revision_steps(
    down="DELETE FROM queen.log_txns t WHERE NOT EXISTS"
    " (SELECT 1 FROM queen.log_partitions p WHERE p.id = t.partition_id);"
    " ALTER TABLE queen.log_txns ADD CONSTRAINT log_txns_partition_id_fkey FOREIGN KEY (partition_id)"
    " REFERENCES queen.log_partitions (id) ON DELETE CASCADE;"
)
