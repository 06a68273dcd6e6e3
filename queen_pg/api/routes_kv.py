"""KV and locks routes: ``POST /api/v1/kv`` (WIRE.md §2.6) and ``POST /api/v1/locks`` (§2.7).

Both take ``{"operations": [op, ...]}`` and answer 200 ``{"results": [...]}``, one per op. A lost
``required`` KV condition answers 200 ``{"ok": false, "reason": "kv_precondition", "failedIndex",
"kvReason", "version", "value"}`` with no ``results`` and nothing written. Errors of these two
families use the broker envelope the client parses into ``KvError``/``LockError`` (WIRE.md §4):
``{"error": <code>, "code": <code>, "reason": <stable id>, "detail": <prose>}``.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.common import json_response, permit, state, tenant
from queen_pg.api.docs import answers, body
from queen_pg.api.kv_ops import WRITE_OPS, validate_kv_ops, validate_lock_ops
from queen_pg.api.request_key import replay_headers, request_once
from queen_pg.api.schemas import REQUEST_KEY
from queen_pg.api.schemas_ops import KvAnswer, KvRequest, KvVerdict, LocksAnswer, LocksRequest
from queen_pg.engine import kv as kv_engine
from queen_pg.engine import locks as locks_engine
from queen_pg.errors import KV_BAD_REQUEST, LOCKS_BAD_REQUEST, ErrorKind, QueenError, Verdict
from queen_pg.security import Level, need

router = APIRouter()


def family_error(exc: QueenError) -> Response:
    """The KV/locks error envelope; 503s and 429s keep ``Retry-After`` like every other route."""
    body = {
        "error": exc.code,
        "code": exc.code,
        "reason": str(exc.fields.get("reason") or exc.code),
        "detail": str(exc),
    }
    return json_response(body, exc.status, exc.headers())


async def _operations(request: Request, kind: ErrorKind) -> object:
    raw = await request.body()
    if not raw.strip():
        raise QueenError(kind, detail='request body is empty; expected {"operations": [...]}', reason="bad_body")
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise QueenError(kind, detail=f"request body is not valid JSON: {err}", reason="bad_json") from None
    if not isinstance(body, dict) or "operations" not in body:
        raise QueenError(kind, detail='request body must be an object {"operations": [...]}', reason="bad_body")
    return body["operations"]


@router.post(
    "/api/v1/kv",
    summary="Key/value operations in one transaction (WIRE §2.6)",
    description="One result per op, in order. Lost conditions are data (`applied: false` with `reason`), "
    "except a `required` one: then nothing is written and the answer is the 200 verdict `{ok: false, reason: "
    "kv_precondition, failedIndex, kvReason, version, value}` with no `results`. A malformed op is 400 "
    "`kv_bad_request` naming the op index and field (`reason`: a stable id).",
    openapi_extra=body(KvRequest, parameters=REQUEST_KEY),
    responses=answers({200: KvAnswer | KvVerdict}, 400, 413, 422, 429),
)
async def kv(request: Request) -> Response:
    try:
        ops = validate_kv_ops(await _operations(request, KV_BAD_REQUEST), in_transaction=False)
        if any(op["op"] in WRITE_OPS for op in ops):  # the route table lets read-only in for gets
            need(request, Level.READ_WRITE)
        once = await request_once(request, "kv")  # a keyed batch is applied once (outcome window)
        async with permit(request, "kv"):
            result = await kv_engine.apply(state(request).db, tenant(request), ops, once=once)
    except Verdict as verdict:  # a required condition lost: nothing written (WIRE §2.6 "required")
        return json_response({"ok": False, "reason": verdict.reason, **verdict.detail})
    except QueenError as exc:
        return family_error(exc)
    return json_response(result, headers=replay_headers(once))


@router.post(
    "/api/v1/locks",
    summary="Locks and semaphores: acquire, renew, release, get (WIRE §2.7)",
    description="Exactly one result per op, in order. A held lock is data, not an error: `acquired: false` "
    "with `reason` held/contended and the `holders`; a renew or release by a non-holder is `reason: lost`. "
    "A malformed op is 400 `locks_bad_request`.",
    openapi_extra=body(LocksRequest, parameters=REQUEST_KEY),
    responses=answers({200: LocksAnswer}, 400, 413, 422, 429),
)
async def locks(request: Request) -> Response:
    try:
        ops = validate_lock_ops(await _operations(request, LOCKS_BAD_REQUEST))
        once = await request_once(request, "locks")  # a keyed batch is applied once (outcome window)
        async with permit(request, "kv"):
            result = await locks_engine.apply(state(request).db, tenant(request), ops, once=once)
    except QueenError as exc:
        return family_error(exc)
    return json_response(result, headers=replay_headers(once))
