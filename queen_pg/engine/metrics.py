"""What ``GET /metrics`` reads from the database: one call to ``queen.metrics_snapshot_v1`` per
scrape, and ``queen.metrics_partition_queues_v1`` to name the queue of partitions acked by id."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from queen_pg.db.pool import Database

SNAPSHOT_SQL = "SELECT * FROM queen.metrics_snapshot_v1($1)"
PARTITIONS_SQL = "SELECT * FROM queen.metrics_partition_queues_v1($1)"


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


async def snapshot(db: Database, now: datetime | None = None) -> Snapshot:
    rows = await db.fetch(SNAPSHOT_SQL, now)
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
    return Snapshot(queues, groups)


async def partition_queues(db: Database, partition_ids: list[int]) -> dict[int, tuple[str, str]]:
    """partition id -> (tenant, queue) for the ids that still exist."""
    rows = await db.fetch(PARTITIONS_SQL, partition_ids)
    return {r["partition_id"]: (r["tenant"], r["queue"]) for r in rows}
