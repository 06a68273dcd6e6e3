"""Answers of the message browser, the DLQ, traces and consumer-group administration (docs/wire.md#admin;
shapes from ``queen_pg/engine/messages.py``, ``dlq.py`` and ``sql/procedures/050_groups.sql``,
``110_messages.sql``, ``120_traces.sql``), for ``/openapi.json`` only. Conventions as in
``schemas.py``: permissive, a field without a default is always present; queue mode is shown as
``consumerGroup``/``name`` null with ``queueMode: true``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from queen_pg.api.shared.schemas import Answer


class BudgetPage(Answer):
    """A limit/offset page that the answer budget (QUEEN_MAX_ANSWER_BYTES) may stop early."""

    truncated: Literal[True] | None = Field(
        None, description="only when the page stopped before `limit` items at the answer budget"
    )
    nextOffset: int | None = Field(None, description="with truncated: the `offset` of the next page")


# --- messages ------------------------------------------------------------------------------------


class Message(Answer):
    id: str
    transactionId: str
    traceId: str | None
    queue: str
    partition: str
    partitionId: str
    offset: int
    createdAt: str
    data: Any = Field(description="the payload, decoded")


class BrowsedMessage(Message):
    consumerGroup: str | None = Field(None, description="with the consumerGroup parameter")
    status: Literal["consumed", "leased", "pending", "dead"] | None = Field(
        None, description="with the consumerGroup parameter: the message's state for that group"
    )


class MessagePage(BudgetPage):
    messages: list[BrowsedMessage]
    total: int
    limit: int
    offset: int
    queue: str
    partition: str | None
    order: Literal["asc", "desc"]


class MessageGroupState(Answer):
    name: str | None
    queueMode: bool
    cursor: int
    state: str = Field(description="the message's state for the group (consumed, leased, pending, dead)")


class MessageDeadLetter(Answer):
    consumerGroup: str | None
    error: str | None
    attempts: int
    failedAt: str


class MessageConsumerGroup(Answer):
    name: str = Field(description="the group (`__QUEUE_MODE__` for queue mode)")
    consumed: bool = Field(description="the group is done with it (acked, popped with autoAck, dead-lettered)")
    leaseExpiresAt: str | None = Field(description="the live lease that holds it unconsumed, else null")


class MessageDetail(Message):
    """docs/wire.md#message-detail: the fields the client's ``admin.get_message`` reads, plus the browser's."""

    namespace: str | None
    task: str | None
    status: Literal["dead_letter", "completed", "processing", "pending"] = Field(
        description="across groups: dead_letter if a group dead-lettered it, else processing if one holds it "
        "leased, else pending if one has not consumed it (or no group reads the partition), else completed"
    )
    payload: Any = Field(description="the payload, decoded (same as data)")
    isEncrypted: bool
    producerSub: str | None
    errorMessage: str | None = Field(description="the newest dead letter's error")
    retryCount: int = Field(description="redeliveries: the most any group has made (or a dead letter's attempts - 1)")
    leaseExpiresAt: str | None = Field(description="the latest live lease holding it, over every group")
    queueConfig: dict[str, Any]
    consumerGroups: list[MessageConsumerGroup] = Field(description="one per group with a cursor on the partition")
    offsets: list[int] = Field(description="every offset this transactionId names in the partition")
    groups: list[MessageGroupState]
    deadLetters: list[MessageDeadLetter]


class MessageDeleted(Answer):
    success: Literal[True]
    deleted: Literal[True]
    status: Literal["deleted"]
    transactionId: str
    queue: str
    partition: str
    partitionId: str
    offset: int
    offsets: list[int]
    groupsSettled: int
    leasesReleased: int
    deadLettersRemoved: int


class RetryAnswer(Answer):
    """The dead letter, appended again at the end of its partition."""

    success: Literal[True]
    status: Literal["requeued"]
    offset: int
    messageId: str
    queue: str
    partition: str
    partitionId: str
    transactionId: str | None
    consumerGroups: list[str | None] = Field(
        description="the groups that receive it again (those that dead-lettered it; null = queue mode)"
    )


# --- DLQ -----------------------------------------------------------------------------------------


class DeadLetter(Answer):
    id: str | None = Field(description="the message id")
    dlqId: int
    transactionId: str | None
    queue: str
    partition: str
    partitionId: str
    consumerGroup: str | None
    offset: int
    data: Any = Field(description="the payload, decoded (null when it is no longer stored)")
    errorMessage: str | None
    retryCount: int
    createdAt: str | None
    failedAt: str


class DlqPage(BudgetPage):
    messages: list[DeadLetter] = Field(description="newest first")
    total: int
    limit: int
    offset: int


# --- traces --------------------------------------------------------------------------------------


class TraceRecorded(Answer):
    success: Literal[True]
    id: int
    createdAt: str


class TraceEvent(Answer):
    id: int
    consumerGroup: str | None
    queueMode: bool
    eventType: str
    traceNames: list[str]
    data: Any
    createdAt: str


class NamedTraceEvent(TraceEvent):
    partitionId: str
    queue: str
    partition: str
    transactionId: str


class MessageTraces(BudgetPage):
    partitionId: str
    transactionId: str
    queue: str
    partition: str
    traces: list[TraceEvent] = Field(description="oldest first")
    total: int
    limit: int
    offset: int


class TracesByName(BudgetPage):
    traceName: str
    traces: list[NamedTraceEvent] = Field(description="newest first")
    total: int
    limit: int
    offset: int


class TraceName(Answer):
    name: str
    count: int
    lastSeen: str


class TraceNames(Answer):
    names: list[TraceName]
    total: int
    limit: int
    offset: int


# --- consumer groups -----------------------------------------------------------------------------


class GroupOnQueue(Answer):
    name: str | None
    queueMode: bool
    queue: str
    namespace: str | None
    task: str | None
    partitions: int
    totalLag: int
    leasedPartitions: int
    subscriptionMode: str | None
    subscriptionFrom: str | None
    createdAt: str


class GroupList(Answer):
    consumerGroups: list[GroupOnQueue]
    total: int
    limit: int
    offset: int


class GroupPartition(Answer):
    partition: str
    partitionId: str
    cursor: int
    nextOffset: int
    lag: int
    ackedAhead: list[int]
    leaseId: str | None
    leaseExpiresAt: str | None
    leaseEnd: int | None
    leaseLive: bool
    deliveryAttempts: int
    ackedTotal: int
    lastWriteAt: str | None


class GroupQueue(Answer):
    queue: str
    namespace: str | None
    task: str | None
    subscriptionMode: str | None
    subscriptionFrom: str | None
    createdAt: str
    partitionCount: int
    totalLag: int
    leasedPartitions: int
    partitions: list[GroupPartition]


class GroupDetail(Answer):
    name: str | None
    queueMode: bool
    totalLag: int
    queues: list[GroupQueue]


class GroupDeletedOnQueue(Answer):
    queue: str
    cursorsDeleted: int
    leasesBroken: int
    groupDeleted: bool
    cursorsRecreated: int
    resumeFrom: str | None = Field(
        description="the subscription the recreated cursors started from (deleteMetadata=false)"
    )


class GroupDeleted(Answer):
    success: Literal[True]
    group: str | None
    queueMode: bool
    deleteMetadata: bool
    cursorsDeleted: int
    leasesBroken: int
    queues: list[GroupDeletedOnQueue]


class SeekPartition(Answer):
    partition: str
    partitionId: str
    oldCursor: int
    newCursor: int
    lag: int
    leaseBroken: bool


class SeekAnswer(Answer):
    success: Literal[True]
    group: str | None
    queueMode: bool
    queue: str
    partition: str | None
    target: Literal["end", "start", "timestamp"]
    timestamp: str | None
    leasesBroken: int
    partitions: list[SeekPartition]


class SubscriptionAnswer(Answer):
    success: Literal[True]
    group: str | None
    queueMode: bool
    queues: list[str]
    subscriptionFrom: str
    cursorsMoved: Literal[False]
    note: str
