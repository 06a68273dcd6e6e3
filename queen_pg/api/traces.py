"""Traces (docs/wire.md#admin): ``POST /traces`` (the client's ``message["trace"]({...})`` in a consume
handler) and the reads: a message's timeline, traces by name, the names in use.

Kept for ``trace_retention_hours`` (the ``trace_retention`` job). ``/traces/by-name/...`` and
``/traces/names`` are registered before ``/traces/{partitionId}/{transactionId}``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.body import Name, PartitionId, TxnId, read, stored_json
from queen_pg.api.shared.common import answer_budget, check_name, json_response, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.params import Param, message_key, page_params, partition_id_param
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas import ISO, page
from queen_pg.api.shared.schemas_browse import MessageTraces, TraceNames, TraceRecorded, TracesByName
from queen_pg.engine import traces as trace_engine
from queen_pg.engine.pop import QUEUE_MODE
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1/traces")

MAX_NAMES = 32


class TraceBody(msgspec.Struct):
    transactionId: TxnId
    partitionId: PartitionId
    data: Annotated[Any, msgspec.Meta(description="any JSON value; integers within 64 bits")]
    consumerGroup: Name | None = None
    traceNames: Annotated[list[Name], msgspec.Meta(max_length=MAX_NAMES)] | None = None
    traceName: Name | Annotated[list[Name], msgspec.Meta(max_length=MAX_NAMES)] | None = None  # also accepted
    eventType: Name = "info"


CUT = (
    "A page stops early when its traces reach the answer budget (QUEEN_MAX_ANSWER_BYTES; at least one): "
    "then it carries `truncated: true` and `nextOffset`, the offset of the next page."
)
SEARCH = Param("search", "case-insensitive substring of the name", "text")
SINCE = Param("from", f"created at or after, {ISO}", "time")
UNTIL = Param("to", f"created before, {ISO}", "time")


@router.post(
    "",
    status_code=201,
    summary="Record a trace event about a message",
    description="The message is named as a pop delivered it (partitionId, transactionId); it need not be "
    "retained any more, but its partition must exist (404). consumerGroup defaults to queue mode; at most 32 "
    "traceNames (`traceName`, a string or a list, is accepted too).",
    openapi_extra=body(TraceBody),
    responses=answers({201: TraceRecorded}, 400, 404, 413),
)
@level(Level.READ_WRITE)
async def record(request: Request) -> Response:
    body = await read(request, TraceBody)
    pid = partition_id_param(str(body.partitionId))
    group = body.consumerGroup or QUEUE_MODE
    check_name("consumerGroup", group)
    check_name("eventType", body.eventType)
    raw_names = body.traceNames if body.traceNames is not None else body.traceName
    names = [raw_names] if isinstance(raw_names, str) else list(raw_names or [])
    for n in names:
        check_name("trace", n)
    event = trace_engine.TraceEvent(
        pid, body.transactionId, group, names, body.eventType, stored_json(body.data, "data", nul_ok=True)
    )
    st = state(request)
    result = await trace_engine.record(st.db, tenant(request), event)
    return json_response({"success": True, "id": result["id"], "createdAt": result["createdAt"]}, 201)


@read_route(
    router,
    "/names",
    TraceNames,
    summary="Trace names in use, with counts (search, limit, offset)",
    query=(SEARCH, *page()),
    errors=(400,),
)
async def names(request: Request) -> Any:
    return await trace_engine.names(*db_tenant(request), SEARCH.read(request), page_params(request))


@read_route(
    router,
    "/by-name/{name}",
    TracesByName,
    summary="Traces carrying a name, newest first (from, to, limit, offset)",
    description=CUT,
    query=(SINCE, UNTIL, *page()),
    errors=(400, 413),
)
async def by_name(request: Request, name: str) -> Any:
    check_name("trace", name)
    since, until = SINCE.read(request), UNTIL.read(request)  # from >= to: an empty window, an empty page
    page, budget = page_params(request), answer_budget(request)
    return await trace_engine.by_name(*db_tenant(request), name, since, until, page, budget)


@read_route(
    router,
    "/{partition_id}/{transaction_id:path}",
    MessageTraces,
    summary="A message's trace timeline, oldest first",
    description="A message with no trace is an empty timeline; an unknown partition is 404. " + CUT,
    query=page(),
    errors=(400, 404),
)
async def for_message(request: Request, partition_id: str, transaction_id: str) -> Any:
    pid, txn = message_key(partition_id, transaction_id)
    page, budget = page_params(request), answer_budget(request)
    return await trace_engine.for_message(*db_tenant(request), pid, txn, page, budget)
