"""Answer models of the data plane (push, pop, ack, lease) and the shared query parameters and headers
the routes read by hand, for ``/openapi.json`` only (``queen_pg/api/docs.py``): the routes build their
answers as dicts (the engine's, or SQL's JSON) and never validate them against these models.

Field names are WIRE.md's; every field a client reads is named. Answers are permissive
(``extra="allow"``): a broker may add keys, and clients ignore the ones they do not know. A field
without a default is always present (possibly ``null``); one with a default may be absent. Other
families: ``schemas_ops.py`` (KV, locks, the transaction), ``schemas_timers.py``, ``schemas_admin.py``
(queues, resources, status, system), ``schemas_browse.py`` (messages, DLQ, traces, consumer groups).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from queen_pg.api.docs import header, query


class Answer(BaseModel):
    """Base of every documented answer: unknown keys allowed."""

    model_config = ConfigDict(extra="allow")


ISO = "ISO-8601 timestamp with a zone (e.g. 2026-01-01T00:00:00Z)"

# --- parameters read by hand (documented through openapi_extra) ---------------------------------

REQUEST_KEY = (
    header(
        "Idempotency-Key",
        "Applies the request at most once within QUEEN_REQUEST_ID_WINDOW_S: a retry with the same key, route "
        "and body gets the recorded answer (with `Idempotent-Replayed: true`); the same key with another "
        "body is 422 `idempotency_key_reused`. At most 255 bytes.",
    ),
    header("X-Request-Id", "Used as the request key when Idempotency-Key is absent (same rules)."),
)


def page(default: int = 100, most: int = 1000) -> tuple[dict[str, Any], dict[str, Any]]:
    """``limit`` and ``offset`` of a paged list (anything else is 400 ``bad_request``)."""
    return (
        query("limit", f"page size, 1-{most}", type="integer", minimum=1, maximum=most, default=default),
        query("offset", "rows to skip", type="integer", minimum=0, default=0),
    )


def window(*, queue: bool = False) -> tuple[dict[str, Any], ...]:
    """``from``/``to``/``interval`` of a time series (``to - from`` holds at most 10080 buckets)."""
    out = (
        query("from", f"start of the window, {ISO}; default `to` minus one hour", format="date-time"),
        query("to", f"end of the window, {ISO}; default now", format="date-time"),
        query("interval", "bucket size", enum=["minute", "hour", "day"], default="minute"),
    )
    return (query("queue", "only this queue"), *out) if queue else out


_POP_COMMON = (
    query(
        "batch", "messages to claim (1..QUEEN_MAX_BATCH); default 1, or 100 under autopilot", type="integer", minimum=1
    ),
    query("wait", "long-poll: park until a message arrives or `timeout` passes", type="boolean", default=False),
    query("timeout", "long-poll budget in ms (0-600000)", type="integer", minimum=0, maximum=600000, default=30000),
    query("consumerGroup", "read as this consumer group; absent = queue mode"),
    query(
        "autopilot",
        "the broker chooses batch and partitions, and echoes them in `autopilot`",
        type="boolean",
        default=False,
    ),
    query("partitions", "partitions one pop may claim (1-1000); default 1, 4 under autopilot", type="integer"),
    query("autoAck", "at-most-once: the claimed messages are acked on delivery (no lease)", type="boolean"),
    query(
        "subscriptionMode",
        "where a new consumer group starts (WIRE §9.2): `new`/`new-only` = messages written after its first pop; "
        "anything else (`all`, `from_beginning`, an unknown word) = from the first retained message",
    ),
    query("subscriptionFrom", f"where a new consumer group starts: {ISO} (wins over subscriptionMode), or `now`"),
    query(
        "leaseSeconds",
        "this claim's lease length in seconds, instead of the queue's leaseTime (WIRE §9.3)",
        type="integer",
        minimum=1,
        maximum=7 * 86400,
    ),
)
POP_PARAMS = _POP_COMMON
POP_TAGGED_PARAMS = (
    query("namespace", "pop from the queues tagged with this namespace (namespace and/or task is required)"),
    query("task", "pop from the queues tagged with this task (namespace and/or task is required)"),
    *_POP_COMMON,
)

# --- push ----------------------------------------------------------------------------------------


class PushResult(Answer):
    """One pushed item, in the order of the request's items (``results[i]`` ↔ ``items[i]``)."""

    index: int
    status: Literal["queued", "duplicate"] = Field(
        description="`duplicate`: the transactionId is already in the queue's dedup window; messageId and "
        "offset are the original message's"
    )
    transactionId: str
    messageId: str
    queue: str
    partition: str
    partitionId: str = Field(description="the partition's numeric id, as a string")
    offset: int | None
    error: str | None


# --- pop -----------------------------------------------------------------------------------------


class PopMessage(Answer):
    id: str
    transactionId: str
    partitionId: str
    partition: str
    queue: str
    leaseId: str | None = Field(description="null under autoAck")
    consumerGroup: str | None
    data: Any = Field(description="the payload, as pushed")
    createdAt: str
    traceId: str | None
    producerSub: str | None
    deliveryAttempt: int
    retryCount: int
    offset: int


class AutopilotEcho(Answer):
    partitions: int
    batch: int
    waitMs: int


class PopAnswer(Answer):
    success: bool
    queue: str
    partition: str = Field(description="the first claimed partition; each message names its own")
    partitionId: str
    leaseId: str = Field(description="one lease for every claimed partition; empty under autoAck")
    consumerGroup: str | None
    partitionsClaimed: int
    messages: list[PopMessage]
    autopilot: AutopilotEcho | None = Field(None, description="only when the request had autopilot=true")


# --- ack and lease -------------------------------------------------------------------------------


class AckResult(Answer):
    """One acknowledgment; a refused one (unknown partition, lease not held, ...) is ``success: false``."""

    index: int
    transactionId: str
    success: bool
    error: str | None
    leaseReleased: bool
    dlq: bool
    noop: bool


class LeaseAnswer(Answer):
    leaseId: str
    success: bool
    renewed: int
    newExpiresAt: str | None
    expiresAt: str | None
    lease_expires_at: str | None
    error: str | None = Field(None, description="when the lease is gone")
