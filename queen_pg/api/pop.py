"""Data-plane routes: push, pop, ack, lease extend (docs/wire.md#push)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared import binary
from queen_pg.api.shared import params as P
from queen_pg.api.shared.body import MAX_TXN_BYTES, NO_NUL, Name, NewTxnId, Text, TxnId, narrow, read, stored_json
from queen_pg.api.shared.common import (
    check_name,
    json_response,
    permit,
    producer_sub,
    push_messages,
    state,
    tenant,
    wake_pushed,
)
from queen_pg.api.shared.docs import answers, body, params
from queen_pg.api.shared.longpoll import run_pop
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY, AckResult, LeaseAnswer, PopAnswer, PushResult
from queen_pg.api.status.metrics import count_ack, count_pop, count_push
from queen_pg.api.status.system import pop_in_maintenance, refuse_push_in_maintenance
from queen_pg.engine import ack as ack_engine
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine.pop_frames import FramedPop
from queen_pg.engine.waiters import TooManyWaiters
from queen_pg.errors import bad_request

router = APIRouter(prefix="/api/v1")

AUTOPILOT_BATCH = 100  # autopilot: messages per pop across the claimed partitions
AUTOPILOT_PARTITIONS = 4  # autopilot: partitions one pop may claim when the request names none
MAX_TIMEOUT_MS = 600_000
MAX_LEASE_SECONDS = 7 * 86400  # pop leaseSeconds: the range of a queue's leaseTime
NEW_MODES = frozenset({"new", "new-only"})
POP_DESCRIPTION = (
    "Claims a batch under one lease (docs/wire.md#pop). No message: 204 (no body), at once or, with wait=true, when "
    "the timeout passes; also 204 at once while pop maintenance is on. 429 `overloaded` when too many pops "
    "are parked."
)
ACK_DESCRIPTION = (
    "One result per acknowledgment, always HTTP 200: a refused item (unknown partition, lease not held) is "
    "`success: false` with `error`. status: completed (or success), failed, retry, dlq."
)


# --- request bodies (queen_pg/api/shared/body.py) -------------------------------------------------------

_UUID = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
TraceId = Annotated[str, msgspec.Meta(pattern=_UUID, description="a UUID")]
_STATUS_WORDS = tuple(ack_engine.STATUSES)
# case-insensitive, as clients send it; JSON Schema regexes have no flags, hence [Cc][Oo]...
_STATUS_PATTERN = "^(?:" + "|".join("".join(f"[{c.upper()}{c}]" for c in w) for w in _STATUS_WORDS) + ")$"
AckStatus = Annotated[
    str,
    msgspec.Meta(pattern=_STATUS_PATTERN, description="completed (or success), failed, retry, dlq; any letter case"),
]
# the usual lower-case spellings are checked without a regex per item (any other case: the pattern decides)
narrow(_STATUS_PATTERN, Literal.__getitem__(_STATUS_WORDS))
# An ack names the partition as a pop returned it; anything else is that item's `success: false`
# ("unknown partitionId"), never a refusal of the whole call.
AckPartitionId = Annotated[
    Annotated[str, msgspec.Meta(pattern=NO_NUL)] | int,
    msgspec.Meta(description="the partition's numeric id as a pop returned it; an unknown one fails the item only"),
]
JSON_VALUE = "any JSON value; integers within 64 bits"


class PushItem(msgspec.Struct):
    """One message. ``payload`` (or ``data``, the 0.x name) is stored as given and must come back exactly."""

    queue: Name
    partition: Name = "Default"
    payload: Annotated[Any, msgspec.Meta(description=JSON_VALUE)] = msgspec.UNSET
    data: Annotated[Any, msgspec.Meta(description="the payload, when `payload` is absent")] = None
    transactionId: NewTxnId | None = None
    traceId: TraceId | None = None


class PushBody(msgspec.Struct):
    items: Annotated[list[PushItem], msgspec.Meta(min_length=1)]


# Decoded under the engine's attribute names (``ack_engine.AckLike``, the wire names as msgspec field
# names) and settled as it is: the route only normalizes it in place (status case, the batch's group, a
# numeric partitionId as text), never copies it into a second object.
class AckItem(msgspec.Struct):
    transaction_id: TxnId = msgspec.field(name="transactionId")
    partition_id: AckPartitionId = msgspec.field(name="partitionId")
    status: AckStatus = "completed"
    error: Text | None = None
    group: Name | None = msgspec.field(default=None, name="consumerGroup")
    lease_id: Text | None = msgspec.field(default=None, name="leaseId")


class AckBatchBody(msgspec.Struct):
    acknowledgments: list[AckItem]
    consumerGroup: Name | None = None


def new_messages(items: list[PushItem], where: str, producer: str | None = None) -> list[push_engine.NewMessage]:
    """Decoded push items as the engine takes them (also used by the transaction route): ``where`` =
    the items' path in the body (``items``), an error names ``{where}.{i}``. The Struct said
    everything but the byte limits and whether the payload can be stored exactly; each distinct
    (queue, partition) is checked once. ``producer`` = the token's sub (``producer_sub(request)``);
    a body ``producerSub`` is never read."""
    checked: set[tuple[str, str]] = set()
    out: list[push_engine.NewMessage] = []
    unset = msgspec.UNSET
    dumps = orjson.dumps
    make = push_engine.NewMessage._make  # a tuple without NamedTuple.__new__'s Python frame
    for i, it in enumerate(items):
        queue, partition, txn = it.queue, it.partition, it.transactionId
        if (queue, partition) not in checked:
            check_name("queue", queue)
            if partition != "Default":
                check_name("partition", partition)
            checked.add((queue, partition))
        if txn is not None and len(txn) * 4 > MAX_TXN_BYTES and len(txn.encode()) > MAX_TXN_BYTES:
            raise bad_request(f"{where}.{i}.transactionId: longer than {MAX_TXN_BYTES} bytes of UTF-8")
        # U+0000 is fine in a payload: it is stored in a segment, not a text column (a dead letter whose
        # payload jsonb refuses is kept by dlq_fill without one)
        value = it.data if it.payload is unset else it.payload
        try:
            payload = dumps(value)
        except orjson.JSONEncodeError:
            payload = stored_json(value, f"{where}.{i}.payload", nul_ok=True)  # raises, worded as for any body
        trace = uuid.UUID(it.traceId) if it.traceId else None
        out.append(make((queue, partition, payload, txn, trace, producer, None)))
    return out


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
async def push(request: Request) -> Response:
    refuse_push_in_maintenance(request)
    if binary.is_binary(request):
        return await binary.push(request)  # QPB1 (docs/wire.md#binary-push)
    body = await read(request, PushBody)
    sub = producer_sub(request)
    items = new_messages(body.items, "items", sub)
    st = state(request)
    ten = tenant(request)
    once = await request_once(request, "push")  # a keyed push is applied once, and never fused
    results = await push_messages(request, ten, items, once)
    wake_pushed(st, ten, results.queues)
    count_push(request, ten, results)
    return Response(results.body, 201, replay_headers(once), "application/json")  # rendered by the engine


# --- pop query parameters: documented and read from these specs ------------------------------------

NAMESPACE = P.Param("namespace", "pop from the queues tagged with this namespace (namespace and/or task is required)")
TASK = P.Param("task", "pop from the queues tagged with this task (namespace and/or task is required)")
BATCH = P.Param(
    "batch",
    "messages to claim; default 1, or 100 under autopilot; above QUEEN_MAX_BATCH reads as QUEEN_MAX_BATCH",
    "int",
    lo=1,
    hi=P.INT64,
)
WAIT = P.Param("wait", "long-poll: park until a message arrives or `timeout` passes", "bool", False)
TIMEOUT = P.Param("timeout", "long-poll budget in ms", "int", 30_000, 0, MAX_TIMEOUT_MS)
GROUP = P.Param("consumerGroup", "read as this consumer group; absent = queue mode")
AUTOPILOT = P.Param(
    "autopilot", "the broker chooses batch and partitions, and echoes them in `autopilot`", "bool", False
)
PARTITIONS = P.Param("partitions", "partitions one pop may claim; default 1, 4 under autopilot", "int", None, 1, 1000)
AUTO_ACK = P.Param("autoAck", "at-most-once: the claimed messages are acked on delivery (no lease)", "bool", False)
MODE = P.Param(
    "subscriptionMode",
    "where a new consumer group starts (docs/wire.md#subscription): `new`/`new-only` = messages written after "
    "its first pop; "
    "anything else (`all`, `from_beginning`, an unknown word) = from the first retained message",
    "text",
)
SUB_FROM = P.Param(
    "subscriptionFrom",
    f"where a new consumer group starts: {P.ISO} (wins over subscriptionMode), or `now`",
    "time",
    now_ok=True,
)
LEASE_SECONDS = P.Param(
    "leaseSeconds",
    "this claim's lease length in seconds, instead of the queue's leaseTime (docs/wire.md#lease-seconds)",
    "int",
    None,
    1,
    MAX_LEASE_SECONDS,
)
FRAMES = P.Param(
    "frames",
    "answer 200 as the framed pop (QPF1, `application/x-queen-pop`, docs/wire.md#framed-pop): the stored "
    "segments as they are "
    "where the lease covers them whole, cut where it must (partial segments, dropped duplicates, offsets settled "
    "out of order)",
    "bool",
    False,
)
_POP_COMMON = (BATCH, WAIT, TIMEOUT, GROUP, AUTOPILOT, PARTITIONS, AUTO_ACK, MODE, SUB_FROM, LEASE_SECONDS, FRAMES)
POP_PARAMS = tuple(p.doc() for p in _POP_COMMON)
POP_TAGGED_PARAMS = tuple(p.doc() for p in (NAMESPACE, TASK, *_POP_COMMON))


def subscription(request: Request) -> tuple[str, datetime | None]:
    """Where a new consumer group starts (docs/wire.md#subscription), decided in this order: a subscriptionFrom other
    than `now` → from that time (`from`); subscriptionMode `new`/`new-only` or subscriptionFrom=now →
    messages written after the group's first pop (`new`, timed by the database); anything else (`all`,
    `from_beginning`, an unknown word, nothing) → from the first retained message (`all`). A mode is
    never a reason for a 400; a malformed subscriptionFrom timestamp is."""
    mode: str | None = MODE.read(request)
    if request.query_params.get("subscriptionFrom") == "now":
        return "new", None
    since: datetime | None = SUB_FROM.read(request)
    if since is not None:
        return "from", since
    return ("new" if mode in NEW_MODES else "all"), None


def _pop_request(request: Request, queue: str | None, partition: str | None) -> pop_engine.PopRequest:
    st = state(request)
    namespace = task = None
    if queue is not None:
        check_name("queue", queue)
    else:
        namespace, task = NAMESPACE.read(request), TASK.read(request)
        if namespace is None and task is None:
            raise bad_request("a pop without a queue needs namespace and/or task")
    if partition is not None:
        check_name("partition", partition)
    autopilot: bool = AUTOPILOT.read(request)
    batch: int | None = BATCH.read(request)
    partitions: int | None = PARTITIONS.read(request)
    mode, sub_from = subscription(request)
    return pop_engine.PopRequest(
        queue=queue,
        namespace=namespace,
        task=task,
        partition=partition,
        group=GROUP.read(request),
        batch=min(batch, st.settings.max_batch) if batch is not None else (AUTOPILOT_BATCH if autopilot else 1),
        partitions=partitions if partitions is not None else (AUTOPILOT_PARTITIONS if autopilot else 1),
        wait=WAIT.read(request),
        timeout_ms=TIMEOUT.read(request),
        auto_ack=AUTO_ACK.read(request),
        subscription_mode=mode,
        subscription_from=sub_from,
        autopilot=autopilot,
        lease_seconds=LEASE_SECONDS.read(request),
        frames=FRAMES.read(request),
    )


# A consumer repeats one request: its PopRequest (a pure function of the path, the query string and
# max_batch; frozen) is read once. A request that is refused (400) is never kept.
_POP_REQUESTS: dict[tuple[str | None, str | None, bytes, int], pop_engine.PopRequest] = {}
POP_REQUESTS_KEPT = 1024  # distinct (path, query) kept at most; the map starts over when full


def _pop_request_of(request: Request, queue: str | None, partition: str | None) -> pop_engine.PopRequest:
    key = (queue, partition, request.scope["query_string"], state(request).settings.max_batch)
    req = _POP_REQUESTS.get(key)
    if req is None:
        req = _pop_request(request, queue, partition)
        if len(_POP_REQUESTS) >= POP_REQUESTS_KEPT:
            _POP_REQUESTS.clear()
        _POP_REQUESTS[key] = req
    return req


async def _pop(request: Request, queue: str | None, partition: str | None) -> Response:
    req = _pop_request_of(request, queue, partition)
    if pop_in_maintenance(request):
        return Response(status_code=204)
    try:
        answer = await run_pop(request, req)  # a client that goes away while it waits takes no lease
    except TooManyWaiters as exc:
        return json_response(
            {"error": str(exc), "code": "overloaded"},
            429,
            {"Retry-After": "1"},
        )
    count_pop(request, answer)
    if answer is None:
        return Response(status_code=204)
    if isinstance(answer, FramedPop):
        return binary.pop_response(answer)
    return Response(answer.body, media_type="application/json")


@router.get(
    "/pop",
    summary="Pop across the queues tagged with namespace/task (docs/wire.md#pop)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_TAGGED_PARAMS),
    responses=binary.framed_answer(answers({200: PopAnswer, 204: None}, 400, 413, 429)),
)
async def pop_tagged(request: Request) -> Response:
    return await _pop(request, None, None)


@router.get(
    "/pop/queue/{queue}",
    summary="Pop from a queue (docs/wire.md#pop)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_PARAMS),
    responses=binary.framed_answer(answers({200: PopAnswer, 204: None}, 400, 413, 429)),
)
async def pop_queue(request: Request, queue: str) -> Response:
    return await _pop(request, queue, None)


@router.get(
    "/pop/queue/{queue}/partition/{partition}",
    summary="Pop from one partition (docs/wire.md#pop)",
    description=POP_DESCRIPTION,
    openapi_extra=params(*POP_PARAMS),
    responses=binary.framed_answer(answers({200: PopAnswer, 204: None}, 400, 413, 429)),
)
async def pop_partition(request: Request, queue: str, partition: str) -> Response:
    return await _pop(request, queue, partition)


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
async def ack_batch(request: Request) -> Response:
    body = await read(request, AckBatchBody)
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
    responses=answers({200: LeaseAnswer}, 429),
)
async def extend(request: Request, lease_id: str) -> Response:
    if "\x00" in lease_id:
        raise bad_request("a lease id must not contain U+0000")
    st = state(request)
    async with permit(request, "ack"):
        return json_response(await ack_engine.extend_lease(st.db, tenant(request), lease_id))
