"""Answers of KV, locks and the transaction for ``/openapi.json`` (docs/wire.md#transaction); their request
bodies are msgspec Structs beside their routes (``kv/routes.py``, ``transaction.py``). Timers:
``timers/schemas.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from queen_pg.api.shared.schemas import Answer

# --- KV answers ----------------------------------------------------------------------------------


class KvEntry(Answer):
    """A stored entry as a read answers it (get, and each row of getMany/getPrefix)."""

    value: Any = Field(None, description="null for a miss or a stored null; absent in rows read with keysOnly")
    version: int | None = None
    expiresAt: str | None = None
    updatedAt: str | None = None


class KvRow(KvEntry):
    key: str


class KvGetResult(KvEntry):
    index: int
    op: Literal["get"]
    ns: str
    key: str
    found: bool = Field(description="a miss is found: false; {found: true, value: null} is a stored null")


class KvGetManyResult(Answer):
    index: int
    op: Literal["getMany"]
    ns: str
    rows: list[KvRow]
    missing: list[str]


class KvGetPrefixResult(Answer):
    index: int
    op: Literal["getPrefix"]
    ns: str
    prefix: str
    rows: list[KvRow]
    truncated: bool
    nextAfter: str | None


class KvWriteResult(Answer):
    """The key as it is after the op, or (``applied: false``) as it is."""

    index: int
    op: Literal["put", "putIfAbsent", "delete", "incr", "check"]
    ns: str
    key: str
    applied: bool
    reason: str | None = Field(None, description="when not applied: exists, version, absent, limit, type")
    value: Any
    version: int
    expiresAt: str | None = None


KvResult = Annotated[KvGetResult | KvGetManyResult | KvGetPrefixResult | KvWriteResult, Field(discriminator="op")]


class KvAnswer(Answer):
    results: list[KvResult] = Field(description="one per op, in order")


class KvVerdict(Answer):
    """A ``required`` condition was lost: nothing was written, and there is no ``results``."""

    ok: Literal[False]
    reason: Literal["kv_precondition"]
    failedIndex: int
    kvReason: str
    version: int
    value: Any = None


# --- lock answers --------------------------------------------------------------------------------


class LockGuard(Answer):
    """A KV ``check`` op to paste into a transaction's ``kv`` rider."""

    op: Literal["check"]
    ns: str
    key: str
    expect: int
    required: bool


class LockHolder(Answer):
    slot: int
    owner: str
    token: int
    since: str
    expiresAt: str
    renewedAt: str


class _LockResult(Answer):
    index: int
    name: str
    slot: int | None = None
    token: int | None = Field(None, description="the permit's KV version; a renew returns a new, higher one")
    owner: str | None = None
    guard: LockGuard | None = None
    expiresAt: str | None = None
    reason: str | None = Field(None, description="held or contended (acquire), lost (renew, release)")
    holders: list[LockHolder] | None = None


class LockAcquireResult(_LockResult):
    op: Literal["acquire"]
    acquired: bool
    already: bool | None = Field(None, description="the same owner already held the permit")


class LockRenewResult(_LockResult):
    op: Literal["renew"]
    renewed: bool


class LockReleaseResult(_LockResult):
    op: Literal["release"]
    released: bool


class LockGetResult(_LockResult):
    op: Literal["get"]
    held: bool


class LocksAnswer(Answer):
    results: list[
        Annotated[LockAcquireResult | LockRenewResult | LockReleaseResult | LockGetResult, Field(discriminator="op")]
    ] = Field(description="exactly one per op, in order")
