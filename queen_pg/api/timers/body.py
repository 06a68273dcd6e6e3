"""The body of POST /api/v1/timers (docs/wire.md#timers); its ops are also the `timers` rider of
POST /api/v1/transaction."""

from __future__ import annotations

from typing import Annotated

import msgspec

from queen_pg.api.shared.body import Name
from queen_pg.api.timers.ops import (
    MAX_DELAY_MS,
    MAX_OPS,
    MAX_TIMER_KEY_BYTES,
    MAX_TXN_BYTES,
)

TimerQueue = Name  # the byte limit: check_queue_name (timers_bad_request too_long)
TimerKey = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_TIMER_KEY_BYTES,
        pattern=r"^[^\x00-\x1f\x7f-\x9f]+$",
        description="1-1024 bytes of UTF-8, no control characters; '/' is fine",
    ),
]
Txn = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_TXN_BYTES,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="the fired message's transactionId (1-65535 bytes, no control characters)",
    ),
]


class _TimerOp(msgspec.Struct, tag_field="op", forbid_unknown_fields=True):
    pass


class _Schedule(_TimerOp):
    """Server-owned fields (messageId, deliverAt, tenant..., _...) are refused."""

    queue: TimerQueue
    timerKey: TimerKey
    payload: Annotated[
        str, msgspec.Meta(description="base64 of the JSON payload (zstd-compressed first with payloadZstd)")
    ]
    delayMs: Annotated[
        float,
        msgspec.Meta(
            ge=-MAX_DELAY_MS, le=MAX_DELAY_MS, description="milliseconds from now; negative = now; within ±100 years"
        ),
    ]
    txn: Txn | None = None
    partition: TimerQueue | None = None
    payloadZstd: bool = False


class TimerSchedule(_Schedule, tag="schedule"):
    """Schedule (upsert: a second schedule answers `rescheduled`)."""


class TimerReschedule(_Schedule, tag="reschedule"):
    """The same as schedule."""


class TimerCancel(_TimerOp, tag="cancel"):
    queue: TimerQueue
    timerKey: TimerKey
    txn: Txn | None = None


TimerOp = TimerSchedule | TimerReschedule | TimerCancel


class TimersRequest(msgspec.Struct):
    """At most 1000 ops, one per (queue, timerKey)."""

    operations: Annotated[list[TimerOp], msgspec.Meta(max_length=MAX_OPS)]
