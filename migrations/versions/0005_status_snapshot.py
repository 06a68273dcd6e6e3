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

from collections.abc import Sequence

from queen_pg.migrate import execute_sql

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    execute_sql(
        """
        CREATE TABLE IF NOT EXISTS queen.tenant_stats (
            tenant              text NOT NULL,
            queues              bigint NOT NULL,
            partitions          bigint NOT NULL,
            messages            bigint NOT NULL,
            retained            bigint NOT NULL,
            backlog             bigint NOT NULL,
            in_flight           bigint NOT NULL,
            dlq                 bigint NOT NULL,
            consumer_groups     bigint NOT NULL,
            namespaces          bigint NOT NULL,
            tasks               bigint NOT NULL,
            group_lag           bigint NOT NULL,
            lag_seconds         double precision NOT NULL,
            leased_partitions   bigint NOT NULL,
            acked               bigint NOT NULL,
            as_of               timestamptz NOT NULL,
            took_ms             double precision NOT NULL,
            CONSTRAINT tenant_stats_pkey PRIMARY KEY (tenant)
        );
        CREATE TABLE IF NOT EXISTS queen.tenant_minutes (
            tenant              text NOT NULL,
            minute              timestamptz NOT NULL,
            pushed              bigint NOT NULL DEFAULT 0,
            acked               bigint NOT NULL DEFAULT 0,
            CONSTRAINT tenant_minutes_pkey PRIMARY KEY (tenant, minute)
        );
        CREATE INDEX IF NOT EXISTS tenant_minutes_minute_idx ON queen.tenant_minutes (minute);
        INSERT INTO queen.tenant_minutes (tenant, minute, pushed, acked)
        SELECT s.tenant, s.minute, sum(s.pushed), sum(s.acked) FROM queen.stats_minutes s
         WHERE NOT EXISTS (SELECT 1 FROM queen.tenant_minutes)
         GROUP BY s.tenant, s.minute
        ON CONFLICT ON CONSTRAINT tenant_minutes_pkey DO NOTHING;
        """
    )


def downgrade() -> None:
    execute_sql(
        """
        DROP TABLE IF EXISTS queen.tenant_minutes;
        DROP TABLE IF EXISTS queen.tenant_stats;
        """
    )
