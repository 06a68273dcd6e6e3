"""``POST /api/v1/locks`` (docs/wire.md#locks): locks and semaphores, KV's sibling family (same envelope,
same op checks in ops.py, same limiter)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.kv.body import LocksRequest
from queen_pg.api.kv.ops import validate_lock_ops
from queen_pg.api.kv.schemas import LocksAnswer
from queen_pg.api.shared.body import decode_family
from queen_pg.api.shared.common import json_response, permit, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.envelope import exact_ops, family_envelope
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY
from queen_pg.engine import locks as locks_engine
from queen_pg.errors import LOCKS_BAD_REQUEST, QueenError
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter()


@router.post(
    "/api/v1/locks",
    summary="Locks and semaphores: acquire, renew, release, get (docs/wire.md#locks)",
    description="Exactly one result per op, in order. A held lock is data, not an error: `acquired: false` "
    "with `reason` held/contended and the `holders`; a renew or release by a non-holder is `reason: lost`. "
    "A malformed op is 400 `locks_bad_request`.",
    openapi_extra=body(LocksRequest, parameters=REQUEST_KEY),
    responses=answers({200: LocksAnswer}, 400, 413, 422, 429),
)
@level(Level.READ_WRITE)
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
