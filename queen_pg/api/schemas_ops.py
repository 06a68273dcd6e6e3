"""KV, locks and the transaction for ``/openapi.json``: request models that describe what the
hand-written validators accept (``kv_ops.py``; documentation only, the validators stay the authority:
their 400s name the op index and field), and the answers (WIRE.md §2.5-2.7). Timers:
``schemas_timers.py``.

A request op is a discriminated union on ``op``; unknown fields are refused (``additionalProperties:
false``), as the validators refuse them. Name limits are in UTF-8 bytes, hence in descriptions. An
optional field the validators refuse as ``null`` is typed ``X | SkipJsonSchema[None]`` (optional, not
nullable); ``X | None`` means null reads as absent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from queen_pg.api.schemas import AckResult, Answer, PushResult
from queen_pg.api.schemas_timers import TimerResult

MAX_TTL = 2**31 - 1
MAX_VERSION = 2**63 - 1


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")


NS = "namespace: 1-128 bytes, no control characters; `queen-locks` is written only through /api/v1/locks"
KEY = "1-1024 bytes, no control characters"
EXPECT = "the version the key must be at; 0 = the key must not exist"
REQUIRED = "a lost condition refuses the whole call: nothing written, a 200 `kv_precondition` verdict"
EXPIRY = "exactly one of ttlSeconds (seconds, > 0) or forever: true"

# --- KV requests (kv_ops.validate_kv_ops) --------------------------------------------------------


class KvGet(_Op):
    op: Literal["get"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)


class KvGetMany(_Op):
    op: Literal["getMany"]
    ns: str = Field(description=NS)
    keys: list[str] = Field(min_length=1, max_length=256, description=f"each {KEY}")


class KvGetPrefix(_Op):
    """Not allowed in a transaction."""

    op: Literal["getPrefix"]
    ns: str = Field(description=NS)
    prefix: str = Field(description=KEY)
    after: str | SkipJsonSchema[None] = Field(
        None, description="exclusive: the page after this key (a previous nextAfter)"
    )
    limit: int | None = Field(None, description="rows per page; clamped to 1-1000, default 100")
    keysOnly: bool = Field(False, description="rows without `value`")


class _Expiring(_Op):
    ttlSeconds: int | SkipJsonSchema[None] = Field(None, ge=1, le=MAX_TTL, description=EXPIRY)
    forever: Literal[True] | SkipJsonSchema[None] = Field(None, description=EXPIRY)


class KvPut(_Expiring):
    op: Literal["put"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)
    value: Any = Field(description="any JSON value (null is a value); at most 1 MiB as JSON, no U+0000")
    expect: int | SkipJsonSchema[None] = Field(None, ge=0, le=MAX_VERSION, description=EXPECT)
    required: bool = Field(False, description=REQUIRED)


class KvPutIfAbsent(_Expiring):
    op: Literal["putIfAbsent"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)
    value: Any = Field(description="any JSON value (null is a value); at most 1 MiB as JSON, no U+0000")
    expect: Literal[0] | SkipJsonSchema[None] = Field(None, description="only 0 (putIfAbsent means expect 0)")
    required: bool = Field(False, description=REQUIRED)


class KvDelete(_Op):
    op: Literal["delete"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)
    expect: int | SkipJsonSchema[None] = Field(None, ge=0, le=MAX_VERSION, description=EXPECT)
    required: bool = Field(False, description=REQUIRED)


class KvIncr(_Expiring):
    """The TTL applies when the counter is created; an expired or missing counter counts as 0."""

    op: Literal["incr"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)
    delta: float = Field(1, description="a number, never a bool")
    min: float | None = Field(None, description="refused with reason `limit` (nothing written) below it")
    max: float | None = Field(None, description="refused with reason `limit` (nothing written) above it")
    required: bool = Field(False, description=REQUIRED)


class KvCheck(_Op):
    """A condition only (a lock's `guard` is one)."""

    op: Literal["check"]
    ns: str = Field(description=NS)
    key: str = Field(description=KEY)
    expect: int = Field(ge=0, le=MAX_VERSION, description=EXPECT)
    required: bool = Field(False, description=REQUIRED)


KvOp = Annotated[
    KvGet | KvGetMany | KvGetPrefix | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck, Field(discriminator="op")
]
TxKvOp = Annotated[KvGet | KvGetMany | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck, Field(discriminator="op")]


class KvRequest(BaseModel):
    """At most 64 ops and 256 distinct (ns, key) pairs per call, one write per key."""

    operations: list[KvOp] = Field(max_length=64)


# --- lock requests (kv_ops.validate_lock_ops) ----------------------------------------------------

LOCK_NAME = "1-256 bytes, no '#', no control characters"


class LockAcquire(_Op):
    op: Literal["acquire"]
    name: str = Field(description=LOCK_NAME)
    ttlSeconds: int = Field(ge=1, le=MAX_TTL)
    owner: str | None = Field(
        None, description="at most 256 bytes; the same owner acquiring again gets its permit back"
    )
    limit: int | None = Field(
        None, ge=1, le=1024, description="permits (a semaphore when > 1), default 1; at most 1024 slots per call"
    )


class LockRenew(_Op):
    op: Literal["renew"]
    name: str = Field(description=LOCK_NAME)
    token: int = Field(ge=1, le=MAX_VERSION)
    ttlSeconds: int = Field(ge=1, le=MAX_TTL)
    slot: int | None = Field(None, ge=0, le=1023)
    owner: str | None = None


class LockRelease(_Op):
    op: Literal["release"]
    name: str = Field(description=LOCK_NAME)
    token: int = Field(ge=1, le=MAX_VERSION)
    slot: int | None = Field(None, ge=0, le=1023)


class LockGet(_Op):
    op: Literal["get"]
    name: str = Field(description=LOCK_NAME)


class LocksRequest(BaseModel):
    operations: list[Annotated[LockAcquire | LockRenew | LockRelease | LockGet, Field(discriminator="op")]] = Field(
        max_length=64
    )


# --- KV answers ----------------------------------------------------------------------------------


class KvRow(Answer):
    key: str
    value: Any = Field(None, description="absent with keysOnly")
    version: int | None = None
    expiresAt: str | None = None
    updatedAt: str | None = None


class KvGetResult(Answer):
    index: int
    op: Literal["get"]
    ns: str
    key: str
    found: bool = Field(description="a miss is found: false; {found: true, value: null} is a stored null")
    value: Any = None
    version: int | None = None
    expiresAt: str | None = None
    updatedAt: str | None = None


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


# --- transaction answers -------------------------------------------------------------------------


class TxAckResult(AckResult):
    type: Literal["ack"]


class TxPushResult(PushResult):
    type: Literal["push"]


class TransactionDone(Answer):
    transactionId: str
    success: Literal[True]
    results: list[TxAckResult | TxPushResult | KvResult | TimerResult] = Field(
        description="one per flat index: the operations (each ack one slot, each push item one), then kv, then timers"
    )


class TransactionVerdict(Answer):
    """Nothing was written. ``kv_precondition`` is returned by the client (a falsy result); any other
    reason (``rejected_ack``, ``duplicate``, ``too_large``, ``bad_request``) is raised with ``error``."""

    success: Literal[False]
    reason: str
    error: str
    failedIndex: int | None = None
    kvReason: str | None = Field(None, description="with kv_precondition: version, exists, absent, limit, type")
    version: int | None = None
    value: Any = None
