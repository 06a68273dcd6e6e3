"""Messages (docs/wire.md#admin): browse a queue's log, read one message, delete one.

``POST /messages/{partitionId}/{transactionId}/retry`` (put a dead letter back) lives in
``dlq.py``; the routes here answer GET and DELETE only, so the two never shadow each other.
Transaction ids may contain ``/`` (the client does not quote them in paths).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.common import answer_budget, json_response, state, tenant
from queen_pg.api.shared.docs import answers
from queen_pg.api.shared.params import Param, message_key, page_params
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas import ISO, page
from queen_pg.api.shared.schemas_browse import MessageDeleted, MessageDetail, MessagePage
from queen_pg.engine import messages as message_engine
from queen_pg.errors import bad_request
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

MAX_OFFSET = 2**62
QUEUE = Param("queue", "the queue to browse", required=True)
PARTITION = Param("partition", "only this partition (by name)")
FROM_OFFSET = Param("fromOffset", "first log offset (inclusive)", "int", None, 0, MAX_OFFSET)
TO_OFFSET = Param(
    "toOffset", "end log offset (exclusive); at or below fromOffset: an empty page", "int", None, 0, MAX_OFFSET
)
SINCE = Param("from", f"written at or after, {ISO}", "time")
UNTIL = Param("to", f"written before, {ISO}; at or before `from`: an empty page", "time")
ORDER = Param("order", "desc: newest first", "choice", "desc", choices=("asc", "desc"))
GROUP = Param("consumerGroup", "add each message's status for this group (`__QUEUE_MODE__`: queue mode)")
STATUSES = ("consumed", "leased", "pending", "dead")
STATUS = Param(
    "status",
    "only the messages in this state for consumerGroup (required with it): consumed (below the group's "
    "cursor or passed over; an ack is an offset commit), leased (under its live lease), pending, dead "
    "(dead-lettered by it); total and paging count the filtered messages",
    "choice",
    choices=STATUSES,
)


@read_route(
    router,
    "/messages",
    MessagePage,
    summary="Browse a queue's messages (decoded) by partition, offset range and time, paged",
    description="queue (required), partition, fromOffset/toOffset (log offsets, half-open), from/to (ISO "
    "times of the write), order asc|desc (default desc: newest first), consumerGroup (adds each message's "
    "status for that group: consumed, leased, pending or dead), status (only the messages in that state "
    "for consumerGroup, which it requires; total and paging count those), limit (1-1000, default 100), offset. "
    "A page stops early when its messages reach the answer budget (QUEEN_MAX_ANSWER_BYTES; at least one "
    "message): then it carries `truncated: true` and `nextOffset`, the offset of the next page.",
    query=(QUEUE, PARTITION, FROM_OFFSET, TO_OFFSET, SINCE, UNTIL, ORDER, GROUP, STATUS, *page()),
    errors=(400, 404, 413),
)
async def list_messages(request: Request) -> Any:
    queue = QUEUE.read(request)
    group = GROUP.read(request)
    status = STATUS.read(request)
    if status is not None and group is None:
        raise bad_request("query parameter status needs consumerGroup: a message's state is per consumer group")
    order = ORDER.read(request)
    page = page_params(request)
    query = message_engine.MessageQuery(
        queue=queue,
        partition=PARTITION.read(request),
        from_offset=FROM_OFFSET.read(request),
        to_offset=TO_OFFSET.read(request),  # ranges at or below their start select nothing
        since=SINCE.read(request),
        until=UNTIL.read(request),
        descending=order == "desc",
        group=group,
        limit=page.limit,
        offset=page.offset,
        status=status,
        max_bytes=answer_budget(request),
    )
    return await message_engine.list_messages(*db_tenant(request), query)


@read_route(
    router,
    "/messages/{partition_id}/{transaction_id:path}",
    MessageDetail,
    summary="One message: decoded payload and its state in each consumer group",
    errors=(400, 404),
)
async def get_message(request: Request, partition_id: str, transaction_id: str) -> Any:
    return await message_engine.get_message(*db_tenant(request), *message_key(partition_id, transaction_id))


@router.delete(
    "/messages/{partition_id}/{transaction_id:path}",
    summary="Settle a message for every consumer group and drop its transactionId (see description)",
    description="A log cannot drop a message from its middle. The message is marked done for every "
    "consumer group of its queue (as a completed ack), its dead letters are removed and its transactionId "
    "hash is dropped (it can no longer be acked, read or retried by transactionId; a new push with that "
    "transactionId is not a duplicate). Its bytes stay in their segment until retention deletes the "
    "segment: a group created later from the first retained message, or a seek back, still reads it.",
    responses=answers({200: MessageDeleted}, 400, 404),
)
@level(Level.ADMIN)
async def delete_message(request: Request, partition_id: str, transaction_id: str) -> Response:
    pid, txn = message_key(partition_id, transaction_id)
    st = state(request)
    return json_response(await message_engine.delete_message(st.db, tenant(request), pid, txn))
