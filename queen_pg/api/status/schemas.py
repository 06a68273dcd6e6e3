"""Answers of queue management, resources, status/analytics and the system routes (docs/wire.md#configure,
docs/wire.md#admin; shapes from ``sql/procedures/100_resources.sql``, ``140_status.sql``, ``130_system.sql`` and
``status/system.py``), for ``/openapi.json`` only. Conventions as in ``schemas.py``: permissive, a field
without a default is always present. Terms: ``messages`` every offset ever given, ``retained`` those
still stored, ``backlog`` the largest group lag (no group: the retained messages), ``inFlight`` messages
under a live lease not yet acked, ``dlq`` dead letters; queue mode is ``name: null, queueMode: true``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from queen_pg.api.shared.schemas import Answer

# --- queue management and health -----------------------------------------------------------------


class Paged(Answer):
    total: int
    limit: int
    offset: int


class GroupLag(Answer):
    name: str | None
    queueMode: bool
    lag: int


class Totals(Answer):
    messages: int
    retained: int
    backlog: int
    inFlight: int
    dlq: int


class QueueSummary(Totals):
    partitions: int
    groups: list[GroupLag]


class Overview(Answer):
    queues: int
    partitions: int
    messages: int
    retained: int
    backlog: int
    inFlight: int
    dlq: int
    consumerGroups: int = Field(description="(queue, group) pairs")
    namespaces: int
    tasks: int
    timestamp: str = Field(description="when this answer was made")
    asOf: str = Field(
        description="when the counts were computed: the stats_snapshot job refreshes them every few seconds "
        "(QUEEN_STATS_SNAPSHOT_INTERVAL_S); POST /api/v1/stats/refresh recomputes them at once"
    )
    ageSeconds: float = Field(description="timestamp - asOf")


class QueueListItem(QueueSummary):
    name: str
    namespace: str | None
    task: str | None
    createdAt: str


class QueueList(Paged):
    queues: list[QueueListItem]


class QueueConfig(Answer):
    leaseTime: int
    retryLimit: int
    priority: int
    delayedProcessing: int
    windowBuffer: int
    maxSize: int
    retentionSeconds: int
    completedRetentionSeconds: int
    dedupWindowSeconds: int
    encryptionEnabled: bool
    options: dict[str, Any] = Field(description="the options as configured")


class QueueGroup(Answer):
    name: str | None
    queueMode: bool
    subscriptionMode: str | None
    subscriptionFrom: str | None
    createdAt: str
    lag: int
    leasedPartitions: int
    oldestPendingAt: str | None
    lagSeconds: float | None


class PartitionGroup(Answer):
    name: str | None
    queueMode: bool
    cursor: int
    lag: int
    leased: bool
    leaseExpiresAt: str | None
    oldestPendingAt: str | None


class QueuePartition(Answer):
    id: str
    name: str
    nextOffset: int
    firstOffset: int
    retained: int
    lastWriteAt: str | None
    createdAt: str
    groups: list[PartitionGroup]


class QueueHead(Totals):
    """What the two one-queue answers (resources and status) open with."""

    name: str
    namespace: str | None
    task: str | None
    createdAt: str
    updatedAt: str
    config: QueueConfig
    groups: list[QueueGroup]
    partitionsTotal: int


class QueueDetail(QueueHead):
    """``groups`` carry subscription, leases and lag age; ``partitions`` is one page of ``partitionsTotal``."""

    limit: int
    offset: int
    partitions: list[QueuePartition]


class PartitionDepth(Answer):
    partition: str
    pending: int


class QueueDepth(Answer):
    queue: str
    group: str | None = Field(description="null for no group, or queue mode (then queueMode: true)")
    queueMode: bool | None = None
    pending: int
    partitionsPending: int
    conflation: bool
    effectivePending: int
    partitionsTotal: int
    limit: int
    offset: int
    partitions: list[PartitionDepth]


class PartitionItem(Answer):
    id: str
    name: str
    queue: str
    messages: int
    retained: int
    backlog: int
    inFlight: int
    groups: int
    lastWriteAt: str | None
    createdAt: str


class PartitionList(Paged):
    partitions: list[PartitionItem]


class TagItem(Answer):
    namespace: str | None = Field(None, description="in /resources/namespaces")
    task: str | None = Field(None, description="in /resources/tasks")
    queues: int
    partitions: int
    messages: int
    backlog: int
    dlq: int


class NamespaceList(Paged):
    namespaces: list[TagItem]


class TaskList(Paged):
    tasks: list[TagItem]


class LaggingGroup(Answer):
    name: str | None
    queueMode: bool
    queue: str
    partitions: int
    partitionsBehind: int
    lag: int
    oldestPendingAt: str | None
    lagSeconds: float | None


class LaggingGroups(Paged):
    minLagSeconds: int
    groups: list[LaggingGroup]
    asOf: str = Field(
        description="when partitions, partitionsBehind and lag were computed (the tenant's snapshot, "
        "refreshed every QUEEN_STATS_SNAPSHOT_INTERVAL_S or by POST /stats/refresh); lagSeconds is at the answer"
    )


# --- status and analytics ------------------------------------------------------------------------


class Counts(Answer):
    pushed: int
    acked: int


class LastMinute(Counts):
    minute: str


class Throughput(Answer):
    lastMinute: LastMinute
    lastHour: Counts


class Switches(Answer):
    push: bool
    pop: bool


class StatusAnswer(Overview):
    status: Literal["ok"]
    version: str
    database: Literal["up"]
    maintenance: Switches
    throughput: Throughput


class StatusQueue(QueueListItem):
    lagSeconds: float | None
    throughput: Counts = Field(description="over from..to")


class StatusQueues(Paged):
    queues: list[StatusQueue]
    from_: str = Field(alias="from")
    to: str


class Bucket(Answer):
    time: str
    pushed: int
    acked: int
    backlog: int | None = Field(description="null: no sample in the bucket")
    lagSeconds: float | None


class Analytics(Answer):
    queue: str | None
    from_: str = Field(alias="from")
    to: str
    bucketSeconds: int
    interval: Literal["minute", "hour", "day"]
    series: list[Bucket]
    totals: Counts


class StatusQueueDetail(QueueHead):
    lagSeconds: float | None
    from_: str = Field(alias="from")
    to: str
    bucketSeconds: int
    series: list[Bucket]
    totals: Counts


# --- system --------------------------------------------------------------------------------------


class MaintenanceAnswer(Answer):
    """``maintenanceMode`` = push maintenance, ``popMaintenanceMode`` = pop maintenance (Queen 0.x names)."""

    maintenanceMode: bool
    popMaintenanceMode: bool
    push: bool
    pop: bool
    updatedAt: str | None
    success: Literal[True] | None = Field(None, description="on POST")


class StatsRefreshAnswer(Answer):
    success: Literal[True]
    refreshed: bool = Field(description="the caller's tenant's overview counts were recomputed")
    asOf: str | None = Field(description="when they were computed (null: the tenant has no queue)")


class Pool(Answer):
    size: int
    idle: int
    inUse: int
    max: int


class LongPoll(Answer):
    parked: int
    limit: int


class MeshPeer(Answer):
    name: str = Field(description="host:port of a replica, or a worker of this host")
    worker: bool
    connected: bool
    outbox: int = Field(description="frames queued for it")


class MeshState(Answer):
    node: str
    peers: list[MeshPeer]
    framesSent: int
    framesReceived: int
    dropped: int


class ProcessMetrics(Answer):
    pid: int
    uptimeSeconds: float
    cpuSeconds: float
    maxRssBytes: int
    pool: Pool
    longPoll: LongPoll
    maintenance: Switches
    jobs: list[str]
    mesh: MeshState | None = Field(description="the wake mesh as this process sees it; null: no mesh configured")


class SystemMetrics(ProcessMetrics):
    timestamp: str
    version: str
    note: str


class WorkerMetrics(Answer):
    timestamp: str
    workers: list[ProcessMetrics]
    note: str
