"""What the metrics routes read from the database: ``GET /metrics`` one row per tenant
(``queen.metrics_tenants_v1``: the stats_snapshot job's figures, not a scan), ``GET /metrics/queues`` the
per-queue and per-group rows of one page of queues (``queen.metrics_queues_v1``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from queen_pg.db.pool import Database
from queen_pg.engine import calls


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant's figures as of ``as_of`` (sql/procedures/098_stats_snapshot.sql)."""

    tenant: str
    queues: int
    partitions: int
    messages: int
    retained: int
    backlog: int
    in_flight: int
    dlq: int
    consumer_groups: int
    group_lag: int
    lag_seconds: float
    leased_partitions: int
    acked: int
    as_of: datetime


@dataclass(frozen=True, slots=True)
class QueueRow:
    tenant: str
    queue: str
    partitions: int
    messages: int  # every offset ever given
    dlq: int


@dataclass(frozen=True, slots=True)
class GroupRow:
    tenant: str
    queue: str
    group: str  # queue mode is '__QUEUE_MODE__'
    partitions: int
    lag: int  # messages not yet done
    lag_seconds: float  # age of the oldest message not yet done
    leased_partitions: int
    dlq: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    queues: list[QueueRow]
    groups: list[GroupRow]


async def tenants(db: Database) -> list[TenantRow]:
    return [TenantRow(**dict(r)) for r in await db.fetch(calls.METRICS_TENANTS)]


async def queues_page(
    db: Database, tenant: str | None, limit: int, offset: int, now: datetime | None = None
) -> tuple[Snapshot, int]:
    """The rows of one page of queues by (tenant, name), and how many queues there are in all."""
    rows = await db.fetch(calls.METRICS_QUEUES, tenant, limit, offset, now)
    total = int(await db.fetchval(calls.QUEUE_COUNT, tenant))
    queues: list[QueueRow] = []
    groups: list[GroupRow] = []
    for r in rows:
        if r["consumer_group"] is None:
            queues.append(QueueRow(r["tenant"], r["queue"], r["partitions"], r["messages"], r["dlq"]))
        else:
            groups.append(
                GroupRow(
                    r["tenant"],
                    r["queue"],
                    r["consumer_group"],
                    r["partitions"],
                    r["lag"],
                    r["lag_seconds"],
                    r["leased_partitions"],
                    r["dlq"],
                )
            )
    return Snapshot(queues, groups), total
