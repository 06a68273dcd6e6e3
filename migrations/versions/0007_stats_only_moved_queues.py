"""stats_marks.backlog/oldest_at, tenant_minutes.backlog/lag_seconds, group_lag: the stats job samples
only the queues that moved; lagging groups from the snapshot

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

The stats job (``queen.stats_sample_v1``) used to sample every queue every tick; it now samples a queue
only when its pushed or acked counter differs from its mark. An idle queue's backlog and oldest pending
message stay in its mark (``backlog`` NULL: not known yet, so the first tick after this revision samples
every queue once), and each tick writes the tenant's minute row's ``backlog`` and ``lag_seconds`` from
the marks, which is what ``GET /api/v1/status/analytics`` reads for a whole tenant. ``queen.group_lag``
holds each tenant's (queue, group) pairs with a pending message as of its snapshot (the stats_snapshot
job writes it with ``tenant_stats``): what ``GET /api/v1/consumer-groups/lagging`` reads. The same
changes are in ``sql/schema.sql``.

downgrade() drops the four columns and the table.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0007"
down_revision: str | None = "0006"


upgrade, downgrade = revision_steps(
    down="""
    DROP TABLE IF EXISTS queen.group_lag;
    ALTER TABLE queen.tenant_minutes DROP COLUMN IF EXISTS lag_seconds;
    ALTER TABLE queen.tenant_minutes DROP COLUMN IF EXISTS backlog;
    ALTER TABLE queen.stats_marks DROP COLUMN IF EXISTS oldest_at;
    ALTER TABLE queen.stats_marks DROP COLUMN IF EXISTS backlog;
    """
)
