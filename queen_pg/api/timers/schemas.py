"""Answers of the timer routes for ``/openapi.json`` (docs/wire.md#timers); the request body is a msgspec
Struct beside its route (``timers/routes.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from queen_pg.api.shared.schemas import Answer

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
    data: Any = Field(None, description="the payload as JSON (given once: no base64 copy)")
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
    truncated: bool = Field(description="more timers follow: `limit` rows, or the answer budget reached first")
    nextAfter: str | None = Field(description="the last row's timerKey when truncated: pass it as `after`")
