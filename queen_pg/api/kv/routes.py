"""KV and locks routes: ``POST /api/v1/kv`` (docs/wire.md#kv) and ``POST /api/v1/locks`` (docs/wire.md#locks).

Both take ``{"operations": [op, ...]}`` and answer 200 ``{"results": [...]}``, one per op. A lost
``required`` KV condition answers 200 ``{"ok": false, "reason": "kv_precondition", "failedIndex",
"kvReason", "version", "value"}`` with no ``results`` and nothing written. Errors of these two
families use the broker envelope the client parses into ``KvError``/``LockError`` (docs/wire.md#errors):
``{"error": <code>, "code": <code>, "reason": <stable id>, "detail": <prose>}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.kv.ops import WRITE_OPS, validate_kv_ops, validate_lock_ops
from queen_pg.api.kv.schemas import KvAnswer, KvVerdict, LocksAnswer
from queen_pg.api.shared.body import INT32, INT64, decode_family
from queen_pg.api.shared.common import answer_budget, json_response, permit, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY
from queen_pg.engine import kv as kv_engine
from queen_pg.engine import locks as locks_engine
from queen_pg.errors import KV_BAD_REQUEST, LOCKS_BAD_REQUEST, QueenError, Verdict
from queen_pg.security import Level, need

router = APIRouter()

# --- request bodies: the Structs decode (shape, types, ranges, characters); kv_ops.py keeps what a
# --- schema cannot say (UTF-8 byte limits, exactly one expiry, one write per key, key counts) -------

PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]+$"  # no C0/C1 control character, not empty


Ns = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=128,
        pattern=PRINTABLE,
        description="1-128 bytes of UTF-8, no control characters; `queen-locks` is written only through /api/v1/locks",
    ),
]
Key = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=1024, pattern=PRINTABLE, description="1-1024 bytes of UTF-8, no control characters"
    ),
]
Version = Annotated[int, msgspec.Meta(ge=0, le=INT64, description="the version the key must be at; 0 = absent")]
Ttl = Annotated[int, msgspec.Meta(ge=1, le=INT32, description="exactly one of ttlSeconds or forever: true")]
Number = Annotated[float, msgspec.Meta(description="a number (not a bool); integers within 64 bits")]
Required = Annotated[bool, msgspec.Meta(description="a lost condition refuses the whole call (200 verdict)")]
Value = Annotated[Any, msgspec.Meta(description="any JSON value (null is a value); at most 1 MiB, no U+0000")]
UNSET = msgspec.UNSET
U = msgspec.UnsetType


class _Op(msgspec.Struct, tag_field="op", forbid_unknown_fields=True):
    pass


class KvGet(_Op, tag="get"):
    ns: Ns
    key: Key


class KvGetMany(_Op, tag="getMany"):
    ns: Ns
    keys: Annotated[list[Key], msgspec.Meta(min_length=1, max_length=256)]


class KvGetPrefix(_Op, tag="getPrefix"):
    """Not allowed in a transaction."""

    ns: Ns
    prefix: Key
    after: Key | U = UNSET
    limit: Annotated[int, msgspec.Meta(description="rows per page; clamped to 1-1000, default 100")] | None = None
    keysOnly: bool = False


class KvPut(_Op, tag="put"):
    ns: Ns
    key: Key
    value: Value
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    expect: Version | U = UNSET
    required: Required = False


class KvPutIfAbsent(_Op, tag="putIfAbsent"):
    ns: Ns
    key: Key
    value: Value
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    expect: Literal[0] | U = UNSET
    required: Required = False


class KvDelete(_Op, tag="delete"):
    ns: Ns
    key: Key
    expect: Version | U = UNSET
    required: Required = False


class KvIncr(_Op, tag="incr"):
    """The TTL applies when the counter is created; an expired or missing counter counts as 0."""

    ns: Ns
    key: Key
    delta: Number = 1
    min: Number | None = None
    max: Number | None = None
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    required: Required = False


class KvCheck(_Op, tag="check"):
    """A condition only (a lock's `guard` is one)."""

    ns: Ns
    key: Key
    expect: Version
    required: Required = False


KvOp = KvGet | KvGetMany | KvGetPrefix | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck
TxKvOp = KvGet | KvGetMany | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck


class KvRequest(msgspec.Struct):
    """At most 64 ops and 256 distinct (ns, key) pairs per call, one write per key."""

    operations: Annotated[list[KvOp], msgspec.Meta(max_length=64)]


LockName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f-\x9f#]+$",
        description="1-256 bytes of UTF-8, no '#', no control characters",
    ),
]
Owner = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=256,
        pattern=PRINTABLE,
        description="at most 256 bytes of UTF-8; the same owner acquiring again gets its permit back",
    ),
]
Token = Annotated[int, msgspec.Meta(ge=1, le=INT64)]
Slot = Annotated[int, msgspec.Meta(ge=0, le=1023)]


class LockAcquire(_Op, tag="acquire"):
    name: LockName
    ttlSeconds: Ttl
    owner: Owner | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1024, description="permits; at most 1024 slots per call")] | None = None


class LockRenew(_Op, tag="renew"):
    name: LockName
    token: Token
    ttlSeconds: Ttl
    slot: Slot | None = None
    owner: Owner | None = None


class LockRelease(_Op, tag="release"):
    name: LockName
    token: Token
    slot: Slot | None = None


class LockGet(_Op, tag="get"):
    name: LockName


class LocksRequest(msgspec.Struct):
    operations: Annotated[list[LockAcquire | LockRenew | LockRelease | LockGet], msgspec.Meta(max_length=64)]


def family_envelope(exc: QueenError) -> Response:
    """The KV/locks error envelope; 503s and 429s keep ``Retry-After`` like every other route."""
    body = {
        "error": exc.code,
        "code": exc.code,
        "reason": str(exc.fields.get("reason") or exc.code),
        "detail": str(exc),
    }
    return json_response(body, exc.status, exc.headers())


def exact_ops(raw: bytes) -> list[Any]:
    """The body's operations as plain JSON (integers exact) for the semantic checks of kv_ops.py."""
    ops: list[Any] = msgspec.json.decode(raw)["operations"]
    return ops


@router.post(
    "/api/v1/kv",
    summary="Key/value operations in one transaction (docs/wire.md#kv)",
    description="One result per op, in order. Lost conditions are data (`applied: false` with `reason`), "
    "except a `required` one: then nothing is written and the answer is the 200 verdict `{ok: false, reason: "
    "kv_precondition, failedIndex, kvReason, version, value}` with no `results`. A malformed op is 400 "
    "`kv_bad_request` naming the op index and field (`reason`: a stable id). The answer has a byte budget "
    "(QUEEN_MAX_ANSWER_BYTES): a getPrefix page stops early at what the ops before it left (`truncated`, "
    "`nextAfter`), and a batch whose answer would pass it is 413 `answer_too_large`, nothing applied.",
    openapi_extra=body(KvRequest, parameters=REQUEST_KEY),
    responses=answers({200: KvAnswer | KvVerdict}, 400, 413, 422, 429),
)
async def kv(request: Request) -> Response:
    try:
        raw = await request.body()
        decode_family(raw, KvRequest, KV_BAD_REQUEST)
        ops = validate_kv_ops(exact_ops(raw), in_transaction=False)
        if any(op["op"] in WRITE_OPS for op in ops):  # the route table lets read-only in for gets
            need(request, Level.READ_WRITE)
        once = await request_once(request, "kv")  # a keyed batch is applied once (outcome window)
        async with permit(request, "kv"):
            result = await kv_engine.apply(
                state(request).db, tenant(request), ops, once=once, max_bytes=answer_budget(request)
            )
    except Verdict as verdict:  # a required condition lost: nothing written (docs/wire.md#kv "required")
        return json_response({"ok": False, "reason": verdict.reason, **verdict.detail})
    except QueenError as exc:
        return family_envelope(exc)
    return json_response(result, headers=replay_headers(once))


@router.post(
    "/api/v1/locks",
    summary="Locks and semaphores: acquire, renew, release, get (docs/wire.md#locks)",
    description="Exactly one result per op, in order. A held lock is data, not an error: `acquired: false` "
    "with `reason` held/contended and the `holders`; a renew or release by a non-holder is `reason: lost`. "
    "A malformed op is 400 `locks_bad_request`.",
    openapi_extra=body(LocksRequest, parameters=REQUEST_KEY),
    responses=answers({200: LocksAnswer}, 400, 413, 422, 429),
)
async def locks(request: Request) -> Response:
    try:
        raw = await request.body()
        decode_family(raw, LocksRequest, LOCKS_BAD_REQUEST)
        ops = validate_lock_ops(exact_ops(raw))
        once = await request_once(request, "locks")  # a keyed batch is applied once (outcome window)
        async with permit(request, "kv"):
            result = await locks_engine.apply(state(request).db, tenant(request), ops, once=once)
    except QueenError as exc:
        return family_envelope(exc)
    return json_response(result, headers=replay_headers(once))
