"""Dead-letter routes: list, and put a dead letter back on its queue (docs/wire.md#admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.common import answer_budget, json_response, state, tenant
from queen_pg.api.shared.docs import answers
from queen_pg.api.shared.params import Param, message_key, read_page
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas import ISO, page
from queen_pg.api.shared.schemas_browse import DlqPage, RetryAnswer
from queen_pg.engine import dlq as dlq_engine
from queen_pg.errors import NOT_FOUND, RETRY, QueenError
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

MAX_PAGE = 1000
QUEUE = Param("queue", "only this queue")
GROUP = Param("consumerGroup", "only this consumer group")
PARTITION = Param("partition", "only this partition (by name)")
SINCE = Param("from", f"failed at or after, {ISO}", "time")
UNTIL = Param("to", f"failed before, {ISO}", "time")
PAGE = page(100, MAX_PAGE, 10**9)


@read_route(
    router,
    "/dlq",
    DlqPage,
    summary="List dead letters, newest first, paged with limit/offset",
    description="A page stops early when its dead letters reach the answer budget (QUEEN_MAX_ANSWER_BYTES; at "
    "least one): then it carries `truncated: true` and `nextOffset`, the offset of the next page.",
    query=(QUEUE, GROUP, PARTITION, SINCE, UNTIL, *PAGE),
    errors=(400, 413),
)
async def list_dlq(request: Request) -> Any:
    limit, offset = read_page(request, PAGE)
    query = dlq_engine.DlqQuery(
        queue=QUEUE.read(request),
        group=GROUP.read(request),
        partition=PARTITION.read(request),
        since=SINCE.read(request),
        until=UNTIL.read(request),
        limit=limit,
        offset=offset,
        max_bytes=answer_budget(request),
    )
    return await dlq_engine.list_dead(*db_tenant(request), query)


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
@level(Level.ADMIN)
async def retry_message(request: Request, partition_id: str, transaction_id: str) -> Response:
    pid, transaction_id = message_key(partition_id, transaction_id)
    st = state(request)
    result = await dlq_engine.requeue(st.db, tenant(request), pid, transaction_id)
    if result["status"] == "not_found":
        raise QueenError(NOT_FOUND, detail=f"no dead letter {transaction_id!r} in partition {partition_id}")
    if result["status"] == "not_ready":
        raise QueenError(RETRY, detail="the dead letter's segment is gone and its payload not copied out yet")
    return json_response({"success": True, **result})
