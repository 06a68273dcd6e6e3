"""tenant_stats and tenant_minutes: /status and /resources/overview from a snapshot

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08

``queen.tenant_stats`` holds one row of figures per tenant (queues, partitions, messages, backlog, in
flight, DLQ, ...), written by the ``stats_snapshot`` job in one set-based pass; ``GET /api/v1/status``,
``/resources/overview`` and the aggregated ``/metrics`` read it with one primary-key probe instead of a
scan per queue. ``queen.tenant_minutes`` holds the per-tenant sums of ``stats_minutes`` (throughput of
``/status``), backfilled here from the existing rows. The same statements are in ``sql/schema.sql``.
Idempotent, like every revision here (see 0001_baseline.py).

downgrade() drops both tables (the previous release's procedures do not read them).
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0005"
down_revision: str | None = "0004"


upgrade, downgrade = revision_steps(
    down="""
    DROP TABLE IF EXISTS queen.tenant_minutes;
    DROP TABLE IF EXISTS queen.tenant_stats;
    """
)
