"""The pops: GET /api/v1/pop, /pop/queue/{queue}, /pop/queue/{queue}/partition/{partition} (docs/wire.md#pop)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared import binary
from queen_pg.api.shared import params as P
from queen_pg.api.shared.common import (
    check_name,
    json_response,
    state,
)
from queen_pg.api.shared.counting import count_pop
from queen_pg.api.shared.docs import answers, params
from queen_pg.api.shared.gates import pop_in_maintenance
from queen_pg.api.shared.longpoll import run_pop
from queen_pg.api.shared.schemas import PopAnswer
from queen_pg.engine import pop as pop_engine
from queen_pg.engine.waiters import TooManyWaiters
from queen_pg.errors import bad_request
from queen_pg.security.access import level
from queen_pg.security.roles import Level

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
    return Response(answer.body, media_type=answer.media_type)


Endpoint = TypeVar("Endpoint", bound=Callable[..., Awaitable[Response]])


def _pop_route(path: str, summary: str, query: tuple[dict[str, Any], ...]) -> Callable[[Endpoint], Endpoint]:
    """A pop: read-write (it leases, or acks under autoAck), answering messages or 204 (docs/wire.md#pop)."""
    answered = binary.framed_answer(answers({200: PopAnswer, 204: None}, 400, 413, 429))

    def register(endpoint: Endpoint) -> Endpoint:
        route = router.get(
            path, summary=summary, description=POP_DESCRIPTION, openapi_extra=params(*query), responses=answered
        )
        return route(level(Level.READ_WRITE)(endpoint))

    return register


@_pop_route("/pop", "Pop across the queues tagged with namespace/task (docs/wire.md#pop)", POP_TAGGED_PARAMS)
async def pop_tagged(request: Request) -> Response:
    return await _pop(request, None, None)


@_pop_route("/pop/queue/{queue}", "Pop from a queue (docs/wire.md#pop)", POP_PARAMS)
async def pop_queue(request: Request, queue: str) -> Response:
    return await _pop(request, queue, None)


@_pop_route("/pop/queue/{queue}/partition/{partition}", "Pop from one partition (docs/wire.md#pop)", POP_PARAMS)
async def pop_partition(request: Request, queue: str, partition: str) -> Response:
    return await _pop(request, queue, partition)
