"""Answer models of the data plane (push, pop, ack, lease) and the shared query parameters and headers
the routes read by hand, for ``/openapi.json`` only (``queen_pg/api/shared/docs.py``): the routes build their
answers as dicts (the engine's, or SQL's JSON) and never validate them against these models.

Field names are docs/wire.md's; every field a client reads is named. Answers are permissive
(``extra="allow"``): a broker may add keys, and clients ignore the ones they do not know. A field
without a default is always present (possibly ``null``); one with a default may be absent. Other
families: ``kv/schemas.py`` (KV, locks, the transaction), ``timers/schemas.py``, ``admin/schemas.py`` and
``status/schemas.py`` (queues, resources, status, system), ``schemas_browse.py`` (messages, DLQ, traces,
consumer groups).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from queen_pg.api.shared.docs import header
from queen_pg.api.shared.params import ISO, Param, page


class Answer(BaseModel):
    """Base of every documented answer: unknown keys allowed."""

    model_config = ConfigDict(extra="allow")


__all__ = ["ISO", "REQUEST_KEY", "Answer", "page", "window"]

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


def window(*, queue: bool = False) -> tuple[Param, ...]:
    """``from``/``to``/``interval`` of a time series (a wider window is cut to the 10080 buckets ending
    at ``to``; one at or before its start is empty)."""
    out = (
        Param("from", f"start of the window, {ISO}; default `to` minus one hour; before 1970 reads as 1970", "time"),
        Param("to", f"end of the window, {ISO}; default now; clamped to 1970..a day ahead", "time"),
        Param("interval", "bucket size", "choice", "minute", choices=("minute", "hour", "day")),
    )
    return (Param("queue", "only this queue"), *out) if queue else out


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
