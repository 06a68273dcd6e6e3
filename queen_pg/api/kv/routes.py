"""``POST /api/v1/kv`` (docs/wire.md#kv); ``POST /api/v1/locks`` is in locks.py beside it.

Both take ``{"operations": [op, ...]}`` and answer 200 ``{"results": [...]}``, one per op. A lost
``required`` KV condition answers 200 ``{"ok": false, "reason": "kv_precondition", "failedIndex",
"kvReason", "version", "value"}`` with no ``results`` and nothing written. Errors of these two
families use the broker envelope the client parses into ``KvError``/``LockError`` (docs/wire.md#errors):
``{"error": <code>, "code": <code>, "reason": <stable id>, "detail": <prose>}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.kv.body import KvRequest
from queen_pg.api.kv.ops import WRITE_OPS, validate_kv_ops
from queen_pg.api.kv.schemas import KvAnswer, KvVerdict
from queen_pg.api.shared.body import decode_family
from queen_pg.api.shared.common import answer_budget, json_response, permit, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.envelope import exact_ops, family_envelope
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY
from queen_pg.engine import kv as kv_engine
from queen_pg.errors import KV_BAD_REQUEST, QueenError, Verdict
from queen_pg.security.access import level, need
from queen_pg.security.roles import Level

router = APIRouter()


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
@level(Level.READ_ONLY)
async def kv(request: Request) -> Response:
    try:
        raw = await request.body()
        body = decode_family(raw, KvRequest, KV_BAD_REQUEST)
        ops = validate_kv_ops(exact_ops(raw, body.operations), in_transaction=False)
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
