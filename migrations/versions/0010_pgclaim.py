"""queen.log_leases (lease id -> cursor rows) instead of the lease_id index on log_consumers: a claim
becomes a HOT update

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

A leased pop set ``log_consumers.lease_id``, an indexed column (``log_consumers_lease_idx``), so no claim
was ever a HOT update: every claim wrote a new entry into each of the table's indexes. The lookups by
lease id (lease extend, the transaction's required lease, the lease_expiry job) now go through
``queen.log_leases``, one row per claimed cursor row that ``queen.pop_v1`` inserts in its claim
statement; the cursor row stays the truth (every reader checks ``lc.lease_id``), and the lease_expiry
job deletes rows whose cursor let the lease go. The live leases get their rows here, then the index is
dropped. The same changes are in ``sql/schema.sql``.

downgrade() makes the index again and drops the table.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0010"
down_revision: str | None = "0009"


upgrade, downgrade = revision_steps(
    down="""
    CREATE INDEX IF NOT EXISTS log_consumers_lease_idx ON queen.log_consumers (lease_id)
        WHERE lease_id IS NOT NULL;
    DROP TABLE IF EXISTS queen.log_leases;
    """
)
