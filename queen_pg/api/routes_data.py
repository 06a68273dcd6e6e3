"""Data-plane routes: push, pop, ack, lease extend (WIRE.md §2.1–2.4)."""

from __future__ import annotations

import uuid
from datetime import datetime

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.common import (
    check_name,
    json_response,
    parse_body,
    parse_timestamp,
    permit,
    q_bool,
    q_int,
    state,
    tenant,
)
from queen_pg.api.docs import answers, body, params
from queen_pg.api.longpoll import run_pop
from queen_pg.api.models import AckBatchBody, AckItem, PushBody, PushItem
from queen_pg.api.request_key import replay_headers, request_once
from queen_pg.api.routes_metrics import count_ack, count_pop, count_push
from queen_pg.api.routes_system import pop_in_maintenance, refuse_push_in_maintenance
from queen_pg.api.schemas import (
    POP_PARAMS,
    POP_TAGGED_PARAMS,
    REQUEST_KEY,
    AckResult,
    LeaseAnswer,
    PopAnswer,
    PushResult,
)
from queen_pg.engine import ack as ack_engine
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine.waiters import TooManyWaiters
from queen_pg.errors import bad_request

router = APIRouter(prefix="/api/v1")

AUTOPILOT_BATCH = 100  # autopilot: messages per pop across the claimed partitions
AUTOPILOT_PARTITIONS = 4  # autopilot: partitions one pop may claim when the request names none
MAX_TIMEOUT_MS = 600_000
MAX_LEASE_SECONDS = 7 * 86400  # pop leaseSeconds: the range of a queue's leaseTime
NEW_MODES = frozenset({"new", "new-only"})
POP_DESCRIPTION = (
    "Claims a batch under one lease (WIRE §2.2). No message: 204 (no body), at once or, with wait=true, when "
    "the timeout passes; also 204 at once while pop maintenance is on. 429 `overloaded` when too many pops "
    "are parked."
)
ACK_DESCRIPTION = (
    "One result per acknowledgment, always HTTP 200: a refused item (unknown partition, lease not held) is "
    "`success: false` with `error`. status: completed (or success), failed, retry, dlq."
)


def new_message(it: PushItem, where: str) -> push_engine.NewMessage:
    """A validated push item (also used by the transaction route)."""
    check_name("queue", it.queue)
    check_name("partition", it.partition)
    payload = it.payload if "payload" in it.model_fields_set else it.data
    trace: uuid.UUID | None = None
    if it.traceId:
        try:
            trace = uuid.UUID(it.traceId)
        except ValueError:
            raise bad_request(f"{where}.traceId: must be a UUID, got {it.traceId!r}") from None
    if it.transactionId == "":
        raise bad_request(f"{where}.transactionId: must be a non-empty string when given")
    return push_engine.NewMessage(it.queue, it.partition, orjson.dumps(payload), it.transactionId, trace)


@router.post(
    "/push",
    status_code=201,
    summary="Push messages (WIRE §2.1)",
    description="One result per item, in the items' order. A transactionId already in the queue's dedup window "
    "is `status: duplicate` (201 all the same). 503 `maintenance` while push maintenance is on, 507 "
    "`storage_full` while storage is full, 429 `overloaded` when admission or the limiter is saturated.",
    openapi_extra=body(PushBody, parameters=REQUEST_KEY),
    responses=answers({201: list[PushResult]}, 400, 413, 422, 429, 507),
)
async def push(request: Request) -> Response:
    refuse_push_in_maintenance(request)
    body = await parse_body(request, PushBody)
    items = [new_message(it, f"items.{i}") for i, it in enumerate(body.items)]
    st = state(request)
    ten = tenant(request)
    once = await request_once(request, "push")  # a keyed push is applied once, and never fused
    async with permit(request, "push"):
        results = await (st.fuser.push(ten, items, once) if st.fuser else push_engine.push(st.db, ten, items, once))
    for q in {r["queue"] for r in results if r["status"] == "queued"}:
        st.waiters.notify(ten, q)
        st.waiters.notify(ten, pop_engine.ANY_QUEUE)
    count_push(request, results)
    return json_response(results, 201, replay_headers(once))


def subscription(mode: str | None, raw_from: str | None) -> tuple[str, datetime | None]:
    """Where a new consumer group starts (WIRE §9.2), decided in this order: a subscriptionFrom other
    than `now` → from that time (`from`); subscriptionMode `new`/`new-only` or subscriptionFrom=now →
    messages written after the group's first pop (`new`, timed by the database); anything else (`all`,
    `from_beginning`, an unknown word, nothing) → from the first retained message (`all`). A mode is
    never a reason for a 400; a malformed subscriptionFrom timestamp is."""
    if raw_from is not None and raw_from != "now":
        return "from", parse_timestamp("subscriptionFrom", raw_from)
    if raw_from == "now" or mode in NEW_MODES:
        return "new", None
    return "all", None


def _pop_request(request: Request, queue: str | None, partition: str | None) -> pop_engine.PopRequest:
    st = state(request)
    qp = request.query_params
    namespace = qp.get("namespace") or None
    task = qp.get("task") or None
    if queue is not None:
        check_name("queue", queue)
    elif namespace is None and task is None:
        raise bad_request("a pop without a queue needs namespace and/or task")
    if partition is not None:
        check_name("partition", partition)
    autopilot = q_bool(request, "autopilot", False)
    batch = q_int(request, "batch", None, 1, st.settings.max_batch)
    partitions = q_int(request, "partitions", AUTOPILOT_PARTITIONS if autopilot else 1, 1, 1000) or 1
    group = qp.get("consumerGroup") or None
    if group is not None:
        check_name("consumerGroup", group)
    mode, sub_from = subscription(qp.get("subscriptionMode") or None, qp.get("subscriptionFrom") or None)
    return pop_engine.PopRequest(
        queue=queue,
        namespace=namespace if queue is None else None,
        task=task if queue is None else None,
        partition=partition,
        group=group,
        batch=batch if batch is not None else (AUTOPILOT_BATCH if autopilot else 1),
        partitions=partitions,
        wait=q_bool(request, "wait", False),
        timeout_ms=q_int(request, "timeout", 30_000, 0, MAX_TIMEOUT_MS) or 0,
        auto_ack=q_bool(request, "autoAck", False),
        subscription_mode=mode,
        subscription_from=sub_from,
        autopilot=autopilot,
        lease_seconds=q_int(request, "leaseSeconds", None, 1, MAX_LEASE_SECONDS),
    )


async def _pop(request: Request, queue: str | None, partition: str | None) -> Response:
    req = _pop_request(request, queue, partition)
    if pop_in_maintenance(request):
        return Response(status_code=204)
    try:
        answer = await run_pop(request, req)  # a client that goes away while it waits takes no lease
    except TooManyWaiters:
        return json_response(
            {"error": "too many parked long-poll pops on this broker", "code": "overloaded"},
            429,
            {"Retry-After": "1"},
        )
    count_pop(request, answer)
    if answer is None:
        return Response(status_code=204)
    return json_response(answer)


@router.get(
    "/pop",
    summary="Pop across the queues tagged with namespace/task (WIRE §2.2)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_TAGGED_PARAMS),
    responses=answers({200: PopAnswer, 204: None}, 400, 413, 429),
)
async def pop_tagged(request: Request) -> Response:
    return await _pop(request, None, None)


@router.get(
    "/pop/queue/{queue}",
    summary="Pop from a queue (WIRE §2.2)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_PARAMS),
    responses=answers({200: PopAnswer, 204: None}, 400, 413, 429),
)
async def pop_queue(request: Request, queue: str) -> Response:
    return await _pop(request, queue, None)


@router.get(
    "/pop/queue/{queue}/partition/{partition}",
    summary="Pop from one partition (WIRE §2.2)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_PARAMS),
    responses=answers({200: PopAnswer, 204: None}, 400, 413, 429),
)
async def pop_partition(request: Request, queue: str, partition: str) -> Response:
    return await _pop(request, queue, partition)


def _ack_item(it: AckItem, group: str | None) -> ack_engine.AckItem:
    status = it.status.lower()
    if status not in ack_engine.STATUSES:
        raise bad_request(f"status must be one of {sorted(ack_engine.STATUSES)}, got {it.status!r}")
    if it.consumerGroup is not None:
        check_name("consumerGroup", it.consumerGroup)
    return ack_engine.AckItem(
        transaction_id=it.transactionId,
        partition_id=str(it.partitionId),
        status=status,
        error=it.error,
        group=it.consumerGroup or group,
        lease_id=it.leaseId,
    )


async def _settle(request: Request, items: list[ack_engine.AckItem], route: str) -> Response:
    st = state(request)
    ten = tenant(request)
    once = await request_once(request, route)  # a keyed ack is applied once, and never fused
    async with permit(request, "ack"):
        results = await (st.fuser.ack(ten, items, once) if st.fuser else ack_engine.ack(st.db, ten, items, once))
    count_ack(request, items, results)
    return json_response(results, headers=replay_headers(once))


@router.post(
    "/ack",
    summary="Acknowledge one message (WIRE §2.3)",
    description=ACK_DESCRIPTION,
    openapi_extra=body(AckItem, parameters=REQUEST_KEY),
    responses=answers({200: list[AckResult]}, 400, 413, 422, 429),
)
async def ack(request: Request) -> Response:
    it = await parse_body(request, AckItem)
    item = _ack_item(it, None)
    return await _settle(request, [item], "ack")


@router.post(
    "/ack/batch",
    summary="Acknowledge messages (WIRE §2.3)",
    description=ACK_DESCRIPTION + " An empty `acknowledgments` answers [].",
    openapi_extra=body(AckBatchBody, parameters=REQUEST_KEY),
    responses=answers({200: list[AckResult]}, 400, 413, 422, 429),
)
async def ack_batch(request: Request) -> Response:
    body = await parse_body(request, AckBatchBody)
    if body.consumerGroup is not None:
        check_name("consumerGroup", body.consumerGroup)
    items = [_ack_item(it, body.consumerGroup) for it in body.acknowledgments]
    if not items:
        return json_response([])
    return await _settle(request, items, "ack/batch")


@router.post(
    "/lease/{lease_id}/extend",
    summary="Renew a lease (WIRE §2.4); no body",
    description="Takes no body (the client sends `Content-Length: 0`); the lease is renewed by its queue's "
    "leaseTime. A lease that is gone or unknown is a 200 `{success: false, renewed: 0, error}`.",
    responses=answers({200: LeaseAnswer}, 429),
)
async def extend(request: Request, lease_id: str) -> Response:
    st = state(request)
    async with permit(request, "ack"):
        return json_response(await ack_engine.extend_lease(st.db, tenant(request), lease_id))
