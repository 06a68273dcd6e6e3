"""POST /api/v1/push (docs/wire.md#push)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared import admission, binary, item_limit
from queen_pg.api.shared.body import read
from queen_pg.api.shared.common import (
    max_items,
    producer_sub,
    push_messages,
    state,
    tenant,
    wake_pushed,
)
from queen_pg.api.shared.counting import count_push
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.gates import refuse_push_in_maintenance
from queen_pg.api.shared.items import PushItem, new_messages
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY, PushResult
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

_ITEMS = ("items",)


class PushBody(msgspec.Struct):
    items: Annotated[list[PushItem], msgspec.Meta(min_length=1)]


@router.post(
    "/push",
    status_code=201,
    summary="Push messages (docs/wire.md#push)",
    description="One result per item, in the items' order. A transactionId already in the queue's dedup window "
    "is `status: duplicate` (201 all the same). 503 `maintenance` while push maintenance is on, 507 "
    "`storage_full` while storage is full, 429 `overloaded` when admission or the limiter is saturated.",
    openapi_extra=binary.documented(body(PushBody, parameters=REQUEST_KEY)),
    responses=answers({201: list[PushResult]}, 400, 413, 422, 429, 507),
)
@level(Level.READ_WRITE)
async def push(request: Request) -> Response:
    refuse_push_in_maintenance(request)
    if binary.is_binary(request):
        return await binary.push(request)  # QPB1 (docs/wire.md#binary-push)
    cap = max_items(request)
    body = await read(request, PushBody, before=lambda raw: item_limit.check_lists(raw, _ITEMS, cap))
    if len(body.items) > cap:  # counted already, unless a key was spelled with escapes
        raise item_limit.too_many("items", cap, len(body.items))
    await admission.charge_items(request.scope, len(body.items))  # held until answered, as the body's bytes
    sub = producer_sub(request)
    items = new_messages(body.items, "items", sub)
    st = state(request)
    ten = tenant(request)
    once = await request_once(request, "push")  # a keyed push is applied once, and never fused
    results = await push_messages(request, ten, items, once)
    wake_pushed(st, ten, results.queues)
    count_push(request, ten, results)
    return Response(results.body, 201, replay_headers(once), "application/json")  # rendered by the engine
