"""POST /api/v1/ack, /ack/batch and /lease/{lease_id}/extend (docs/wire.md#ack)."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared import item_limit
from queen_pg.api.shared.body import Name, read
from queen_pg.api.shared.common import (
    check_name,
    json_response,
    max_items,
    permit,
    state,
    tenant,
    wake_pushed,
)
from queen_pg.api.shared.counting import count_ack
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.items import AckItem
from queen_pg.api.shared.params import check_id
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY, AckResult, LeaseAnswer
from queen_pg.engine import ack as ack_engine
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

_ACKS = ("acknowledgments",)

ACK_DESCRIPTION = (
    "One result per acknowledgment, always HTTP 200: a refused item (unknown partition, lease not held) is "
    "`success: false` with `error`. status: completed (or success), failed, retry, dlq."
)


class AckBatchBody(msgspec.Struct):
    acknowledgments: list[AckItem]
    consumerGroup: Name | None = None


def _ack_item(it: AckItem, group: str | None) -> AckItem:
    """``it`` normalized in place for the engine: lower-case status, the batch's group when it names
    none, the partitionId as text (metrics key partitions by it)."""
    if it.group is not None:
        check_name("consumerGroup", it.group)
    else:
        it.group = group
    if it.status not in ack_engine.STATUSES:
        it.status = it.status.lower()
    if type(it.partition_id) is int:
        it.partition_id = str(it.partition_id)
    return it


async def _settle(request: Request, items: list[ack_engine.AckLike], route: str) -> Response:
    st = state(request)
    ten = tenant(request)
    once = await request_once(request, route)  # a keyed ack is applied once, and never fused
    if st.fuser is not None:  # it holds an ack permit around each procedure call (engine/fusion.py)
        results = await st.fuser.ack(ten, items, once)
    else:
        async with permit(request, "ack"):
            results = await ack_engine.ack(st.db, ten, items, once)
    count_ack(request, items, results)
    if isinstance(results, ack_engine.AckResults):  # rendered from the verdicts, no dict per item
        wake_pushed(st, ten, results.wake)  # a lease released with messages left, a nack: as a push
        return Response(results.body(), media_type="application/json", headers=replay_headers(once))
    return json_response(results, headers=replay_headers(once))


@router.post(
    "/ack",
    summary="Acknowledge one message (docs/wire.md#ack)",
    description=ACK_DESCRIPTION,
    openapi_extra=body(AckItem, parameters=REQUEST_KEY),
    responses=answers({200: list[AckResult]}, 400, 413, 422, 429),
)
@level(Level.READ_WRITE)
async def ack(request: Request) -> Response:
    it = await read(request, AckItem)
    item = _ack_item(it, None)
    return await _settle(request, [item], "ack")


@router.post(
    "/ack/batch",
    summary="Acknowledge messages (docs/wire.md#ack)",
    description=ACK_DESCRIPTION + " An empty `acknowledgments` answers [].",
    openapi_extra=body(AckBatchBody, parameters=REQUEST_KEY),
    responses=answers({200: list[AckResult]}, 400, 413, 422, 429),
)
@level(Level.READ_WRITE)
async def ack_batch(request: Request) -> Response:
    cap = max_items(request)
    body = await read(request, AckBatchBody, before=lambda raw: item_limit.check_lists(raw, _ACKS, cap))
    if len(body.acknowledgments) > cap:  # counted already, unless a key was spelled with escapes
        raise item_limit.too_many("acknowledgments", cap, len(body.acknowledgments))
    if body.consumerGroup is not None:
        check_name("consumerGroup", body.consumerGroup)
    items: list[ack_engine.AckLike] = [_ack_item(it, body.consumerGroup) for it in body.acknowledgments]
    if not items:
        return json_response([])
    return await _settle(request, items, "ack/batch")


@router.post(
    "/lease/{lease_id}/extend",
    summary="Renew a lease (docs/wire.md#lease-extend); no body",
    description="Takes no body (the client sends `Content-Length: 0`); the lease is renewed by its queue's "
    "leaseTime. A lease that is gone or unknown is a 200 `{success: false, renewed: 0, error}`.",
    responses=answers({200: LeaseAnswer}, 400, 429),
)
@level(Level.READ_WRITE)
async def extend(request: Request, lease_id: str) -> Response:
    check_id("lease id", lease_id)
    st = state(request)
    async with permit(request, "ack"):
        return json_response(await ack_engine.extend_lease(st.db, tenant(request), lease_id))
