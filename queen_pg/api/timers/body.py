"""The body of POST /api/v1/timers (docs/wire.md#timers); its ops are also the `timers` rider of
POST /api/v1/transaction. Built from the rule's constants in ops.py, which decides: the Structs decode
the shape and what msgspec can check of the rule, ops.py the rest (byte limits, payloads, one op per
key)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from queen_pg import text
from queen_pg.api.shared.body import MAX_TXN_BYTES, Name, identifier
from queen_pg.api.timers.ops import MAX_DELAY_MS, MAX_OPS, MAX_TIMER_KEY_BYTES

TimerQueue = Name  # the byte limit: check_queue_name (timers_bad_request too_long)
TimerKey = Annotated[
    str, identifier(MAX_TIMER_KEY_BYTES, f"1-{MAX_TIMER_KEY_BYTES} bytes of UTF-8, {text.RULE}; '/' is fine")
]
Txn = Annotated[
    str,
    identifier(MAX_TXN_BYTES, f"the fired message's transactionId (1-{MAX_TXN_BYTES} bytes of UTF-8, {text.RULE})"),
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
