"""Timers for ``/openapi.json`` (WIRE.md §2.8): the ops ``timer_ops.prepare_timer_ops`` accepts
(documentation only; the validator stays the authority) and the answers of the timer routes. Conventions
as in ``schemas_ops.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from queen_pg.api.schemas import Answer


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- timer requests (timer_ops.prepare_timer_ops) ------------------------------------------------

TIMER_KEY = "1-1024 bytes, no control characters; '/' is fine"


class TimerSchedule(_Op):
    """Server-owned fields (messageId, deliverAt, tenant..., _...) are refused."""

    op: Literal["schedule", "reschedule"] = Field(description="both upsert: a second schedule answers `rescheduled`")
    queue: str = Field(description="a queue name, as for a push")
    timerKey: str = Field(description=TIMER_KEY)
    payload: str = Field(description="base64 of the JSON payload (zstd-compressed first with payloadZstd)")
    delayMs: float = Field(description="milliseconds from now; negative = now; within ±100 years")
    txn: str | None = Field(None, description="the fired message's transactionId; minted when absent")
    partition: str | None = Field(None, description="default `Default`")
    payloadZstd: bool = False


class TimerCancel(_Op):
    op: Literal["cancel"]
    queue: str
    timerKey: str = Field(description=TIMER_KEY)
    txn: str | None = Field(None, description="cancel only the timer with this txn")


TimerOp = Annotated[TimerSchedule | TimerCancel, Field(discriminator="op")]


class TimersRequest(BaseModel):
    """At most 1000 ops, one per (queue, timerKey)."""

    operations: list[TimerOp] = Field(max_length=1000)


# --- timer answers -------------------------------------------------------------------------------


class TimerResult(Answer):
    ok: bool = Field(description="false for absent and too_late")
    status: Literal["scheduled", "rescheduled", "cancelled", "absent", "too_late"]
    queue: str
    timerKey: str
    txn: str | None
    messageId: str | None = None
    deliverAt: str | None = None
    partition: str | None = None
    index: int | None = Field(None, description="the flat index, in a transaction's results")


class TimersAnswer(Answer):
    results: list[TimerResult] = Field(description="one per op, in order")


class TimerPeek(Answer):
    """A pending (or already fired) timer; a miss is ``{"found": false}``."""

    found: bool
    queue: str | None = None
    timerKey: str | None = None
    txn: str | None = None
    messageId: str | None = None
    deliverAt: str | None = None
    partition: str | None = None
    payload: str | None = Field(None, description="base64 of the JSON payload")
    data: Any = Field(None, description="the payload as JSON")
    fired: bool | None = None
    firedAt: str | None = None
    encrypted: bool | None = None


class TimerRow(Answer):
    timerKey: str
    txn: str
    deliverAt: str
    messageId: str
    partition: str


class TimerPage(Answer):
    rows: list[TimerRow]
    truncated: bool
    nextAfter: str | None = Field(description="the last row's timerKey when truncated: pass it as `after`")
