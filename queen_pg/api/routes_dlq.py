"""Dead-letter routes: list, and put a dead letter back on its queue (WIRE.md §2.12)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.common import check_name, json_response, parse_timestamp, q_int, state, tenant
from queen_pg.api.docs import answers, params, query
from queen_pg.api.schemas import ISO, page
from queen_pg.api.schemas_browse import DlqPage, RetryAnswer
from queen_pg.engine import dlq as dlq_engine
from queen_pg.errors import NOT_FOUND, RETRY, QueenError, bad_request

router = APIRouter(prefix="/api/v1")

MAX_PAGE = 1000


@router.get(
    "/dlq",
    summary="List dead letters, newest first, paged with limit/offset",
    openapi_extra=params(
        query("queue", "only this queue"),
        query("consumerGroup", "only this consumer group"),
        query("partition", "only this partition (by name)"),
        query("from", f"failed at or after, {ISO}", format="date-time"),
        query("to", f"failed before, {ISO}", format="date-time"),
        *page(),
    ),
    responses=answers({200: DlqPage}, 400, 413),
)
async def list_dlq(request: Request) -> Response:
    qp = request.query_params
    names = {}
    for param in ("queue", "consumerGroup", "partition"):
        value = qp.get(param) or None
        if value is not None:
            check_name(param, value)
        names[param] = value
    since = parse_timestamp("from", qp["from"]) if qp.get("from") else None
    until = parse_timestamp("to", qp["to"]) if qp.get("to") else None
    query = dlq_engine.DlqQuery(
        queue=names["queue"],
        group=names["consumerGroup"],
        partition=names["partition"],
        since=since,
        until=until,
        limit=q_int(request, "limit", 100, 1, MAX_PAGE) or 100,
        offset=q_int(request, "offset", 0, 0, 10**9) or 0,
    )
    st = state(request)
    return json_response(await dlq_engine.list_dead(st.db, tenant(request), query))


@router.post(
    "/messages/{partition_id}/{transaction_id:path}/retry",
    summary="Put a dead letter back at the end of its partition, for the groups that dead-lettered it (no body)",
    description="Takes no body (the client sends `Content-Length: 0`). Works at once after the message was "
    "dead-lettered (it does not wait for the dlq_fill job). Only the consumer groups that dead-lettered it "
    "(`consumerGroups`; null = queue mode) receive it again; the partition's other groups pass over it. 404 "
    "when the partition holds no such dead letter; 503 `retry` (with Retry-After) only if its segment is "
    "gone and the payload not copied out yet.",
    responses=answers({200: RetryAnswer}, 400, 404),
)
async def retry_message(request: Request, partition_id: str, transaction_id: str) -> Response:
    try:
        pid = int(partition_id)
    except ValueError:
        raise bad_request(f"partitionId must be the numeric id a pop returned, got {partition_id!r}") from None
    if not transaction_id:
        raise bad_request("transactionId is required")
    st = state(request)
    result = await dlq_engine.requeue(st.db, tenant(request), pid, transaction_id)
    if result["status"] == "not_found":
        raise QueenError(NOT_FOUND, detail=f"no dead letter {transaction_id!r} in partition {partition_id}")
    if result["status"] == "not_ready":
        raise QueenError(RETRY, detail="the dead letter's segment is gone and its payload not copied out yet")
    return json_response({"success": True, **result})
